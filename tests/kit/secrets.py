"""Secrets a test inventory carries (tests/test_secrets.py checks where they go): each a value of the form a real
one has, and the part of it that must never be written where others read it."""

from __future__ import annotations

import base64
from typing import Any

JWT = ".".join(base64.urlsafe_b64encode(part).decode().rstrip("=") for part in (
    b'{"alg":"HS256","typ":"JWT"}', b'{"sub":"bench","exp":1893456000}', bytes(range(32))))
HF_TOKEN = "hf_Q7xZp2LmN9vB4kR8sT1wY6uE3oI5aD0fGh"
WANDB_KEY = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b"
DB_PASSWORD = "Pa55-w0rd.x"
DB_URL = f"postgresql://bench:{DB_PASSWORD}@db.internal:5432/results"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
REDIS_PASSWORD = "S3cr3tPw"
REDIS_URL = f"redis://cache:{REDIS_PASSWORD}@10.0.0.5:6379/0"
# (variable, value, the part that must never be written where others read it)
SECRETS = [("HF_TOKEN", HF_TOKEN, HF_TOKEN), ("WANDB_API_KEY", WANDB_KEY, WANDB_KEY),
           ("DATABASE_URL", DB_URL, DB_PASSWORD),
           # allow-listed names (recorded by the environment capture), so only their values can redact them
           ("NCCL_SBENCH_TEST_CRED_X", AWS_SECRET, AWS_SECRET), ("TORCH_STORE_URL", REDIS_URL, REDIS_PASSWORD),
           ("ACCELERATE_REMOTE_ID", JWT, JWT)]
NEVER = [needle for _, _, needle in SECRETS]


def secret_inventory(python: str | None = None) -> dict[str, Any]:
    """A one-host CPU inventory whose env holds every secret, at each level (defaults, partition, host)."""
    doc: dict[str, Any] = {
        "cluster": "secrets",
        "defaults": {"env": {"OMP_NUM_THREADS": "1", "HF_TOKEN": HF_TOKEN, "WANDB_API_KEY": WANDB_KEY},
                     "nccl": {"NCCL_SBENCH_TEST_CRED_X": AWS_SECRET}},
        "partitions": {"cpu": {
            "gpu_model": "cpu", "gpus_per_node": 2, "cpus_per_node": 8, "memory_gb": 16, "time_limit": "00:30:00",
            "env": {"DATABASE_URL": DB_URL, "NCCL_SBENCH_TEST_CRED_X": AWS_SECRET},
            "hosts": {"h1": {"address": "127.0.0.1",
                             "env": {"TORCH_STORE_URL": REDIS_URL, "ACCELERATE_REMOTE_ID": JWT}}}}},
    }
    if python:
        doc["defaults"]["python"] = python
    return doc
