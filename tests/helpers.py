"""Helpers the test files share: the CLI in-process and as a process of its own, and the session's trained
campaigns (built once by :func:`build_trained`, read by many tests, copied by those that change them)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from harness.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMALL_DATASET = "news-chars-512-entries-4096"


# -- the CLI -------------------------------------------------------------------------------------------------------
def invoke(*args: Any) -> Any:
    """``sbench ARGS`` in-process (click's result); an escaped exception, a traceback for the user, fails the
    test."""
    res = CliRunner().invoke(main, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"traceback for {args}: {res.exception!r}\n{res.output}") from res.exception
    return res


def sbench(*args: Any, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 600,
           ok: tuple[int, ...] | None = (0,)) -> subprocess.CompletedProcess[str]:
    """``sbench ARGS`` as a process of its own, as a user runs it (``SBENCH_FAULT`` only when *env* sets it).
    Its exit code must be one of *ok* (None: any); a traceback or a hang past *timeout* fails the test."""
    base = {k: v for k, v in os.environ.items() if k != "SBENCH_FAULT"}
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "harness", *map(str, args)], cwd=cwd, capture_output=True,
                              encoding="utf-8", errors="replace", timeout=timeout, stdin=subprocess.DEVNULL,
                              env={**base, "PYTHONPATH": str(ROOT), **(env or {})})
    except subprocess.TimeoutExpired:
        raise AssertionError(f"sbench {' '.join(map(str, args))} did not finish within {timeout:g} s") from None
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "internal error" not in out, out
    assert time.monotonic() - started < timeout
    if ok is not None:
        assert proc.returncode in ok, f"exit {proc.returncode}\n{out}"
    return proc


def write_yaml(path: Path, doc: Any) -> Path:
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def one_host_inventory(cluster: str = "c", *, gpus: int = 1, memory_gb: int = 8, env: dict[str, str] | None = None,
                       defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """An inventory of this machine alone: partition cpu, host h1 (127.0.0.1) with *gpus* CPU "devices"."""
    part: dict[str, Any] = {"gpu_model": "cpu", "gpus_per_node": gpus, "cpus_per_node": 2, "memory_gb": memory_gb}
    if env is not None:
        part["env"] = env
    part["hosts"] = {"h1": {"address": "127.0.0.1"}}
    return {"cluster": cluster, **({"defaults": defaults} if defaults else {}), "partitions": {"cpu": part}}


# -- secrets the trained campaigns' inventory carries (tests/test_secrets.py checks where they go) -----------------
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


# -- the session's trained campaigns -------------------------------------------------------------------------------
TRAINED_PEAK_TFLOPS = 0.05  # one CPU worker process's peak, as the trained campaigns' inventory declares it
TRAINED_PRICE = 2.5  # one CPU worker process an hour, as the trained campaigns' inventory prices it
TRAINED_CAMPAIGNS = ("nightly-1", "nightly-2")


@dataclass(frozen=True)
class Trained:
    """Two campaigns of one sweep (``nightly-1``, then ``nightly-2``: full fine-tuning of the tiny model, batch 2
    and 4, 4 steps, model_max_length 256, one process, bfloat16 asked on a CPU), trained through the local
    executor and collected.

    The inventory holds every secret of :data:`SECRETS` and runs the jobs through a python wrapper that records
    the hash of the ``HF_TOKEN`` it sees in ``marks/``; it declares a peak of :data:`TRAINED_PEAK_TFLOPS`.
    ``submits`` holds the first submit's JSON and the second's text (stdout and stderr). Read these files; a test
    that changes anything (submits, collects, puts files in) takes :meth:`copy` first."""

    root: Path

    @property
    def inventory(self) -> Path:
        return self.root / "inv.yaml"

    @property
    def sweep(self) -> Path:
        return self.root / "nightly.yaml"

    @property
    def workdir(self) -> Path:
        return self.root / "runs"

    @property
    def db(self) -> Path:
        return self.root / "results.duckdb"

    @property
    def marks(self) -> Path:
        return self.root / "marks"

    @property
    def common(self) -> list[Any]:
        return ["--workdir", self.workdir, "--db", self.db]

    @property
    def local(self) -> list[Any]:
        """The options of a submit of the sweep like the ones that made these campaigns."""
        return ["-i", self.inventory, "--executor", "local", *self.common]

    @property
    def submits(self) -> dict[str, Any]:
        return json.loads((self.root / "submits.json").read_text())

    def copy(self, dst: Path) -> Trained:
        """The campaigns as if they had been trained in *dst*: the files copied, every path they record that is
        under :attr:`root` moved under *dst*, the database left out (collect the copy: it costs a second)."""
        old, new = str(self.root), str(dst)
        shutil.copytree(self.root, dst, symlinks=True, ignore=shutil.ignore_patterns("results.duckdb*"))
        for dirpath, _dirs, names in os.walk(dst):
            for name in names:
                p = Path(dirpath) / name
                if p.is_symlink() or not p.is_file():
                    continue
                data = p.read_bytes()
                if old.encode() in data:
                    mode = p.stat().st_mode
                    p.write_bytes(data.replace(old.encode(), new.encode()))
                    p.chmod(mode)
        return Trained(dst)


def build_trained(root: Path, model: Path, data_dir: Path) -> None:
    """Train and collect the campaigns :class:`Trained` describes, into *root*."""
    t = Trained(root)
    t.marks.mkdir()
    wrapper = root / "python-wrapper"
    wrapper.write_text("#!/bin/sh\n"
                       f'printf %s "$HF_TOKEN" | sha256sum | cut -d" " -f1 > "{t.marks}/hf.$$"\n'
                       f'exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    inv = secret_inventory(python=str(wrapper))
    inv["partitions"]["cpu"]["peak_tflops"] = TRAINED_PEAK_TFLOPS
    inv["partitions"]["cpu"]["price_per_gpu_hour"] = TRAINED_PRICE
    write_yaml(t.inventory, inv)
    write_yaml(t.sweep, {
        "campaign": TRAINED_CAMPAIGNS[0], "experiment": "finetune_full_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "tiny", "model_max_length": 256, "dataset_id": SMALL_DATASET, "number_gpus": 1,
                   "gradient_accumulation_steps": 1, "max_steps": 4, "torch_dtype": "bfloat16"},
        "grid": {"batch_size": [2, 4]},
        "model_map": {"tiny": str(model)}, "data_dir": str(data_dir), "runner": {"sample_interval_s": 0.1}})
    submits = {}
    for campaign, as_json in zip(TRAINED_CAMPAIGNS, (True, False)):  # the first in JSON, the second as text
        proc = sbench("submit", t.sweep, "--campaign", campaign, "--wait", *(["--json"] if as_json else []), *t.local)
        submits[campaign] = {"json": json.loads(proc.stdout)} if as_json else {"stdout": proc.stdout,
                                                                                "stderr": proc.stderr}
        sbench("collect", *t.common)
    (root / "submits.json").write_text(json.dumps(submits, indent=1))


def html_only(page: str) -> str:
    """The page without its scripts' text (the inlined library holds HTML of its own, e.g. its tooltip's tables)."""
    return re.sub(r"<script\b[^>]*>.*?</script>", "<script></script>", page, flags=re.S)
