"""Secrets stay on the node: an inventory ``env:`` value reaches a job only through ``env/<host>.sh`` (mode
0600), never through ``spec.json``, another file others can read, or the database; a credential-shaped value
of a recorded variable is redacted, and ordinary values are not.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml

from harness.contract.paths import JobPaths
from harness.runner.envcapture import REDACTED, redact_value, relevant_env

from .kit import SMALL_DATASET, TEST_INVENTORY, Trained, sbench, sql_rows, write_yaml
from .kit.secrets import AWS_SECRET, DB_URL, HF_TOKEN, JWT, NEVER, REDIS_URL, SECRETS, WANDB_KEY, secret_inventory

# -- the redaction rule, both sides --------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    AWS_SECRET,  # AWS's own example secret access key: base64 with '/'
    "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
    "q3Zr8xYv0PpLk2mN4bWc9A+5tU7hJ1gF6dE2sR8wKaM=",  # base64 with '+' and '=' padding
    "dGhpcyBpcyBhIHNlY3JldA==",  # base64 of a short text, padded
    JWT, f"Bearer {JWT}", f"token={JWT}",
    "hf_abcdefghijklmnopqrstuvwxyz012", "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "AbCdEf0123456789AbCdEf0123456789xyz",  # a long opaque token
])
def test_credential_shaped_values_are_redacted(value: str) -> None:
    assert redact_value(value) == REDACTED


@pytest.mark.parametrize("value,kept", [
    (DB_URL, "postgresql://bench:<redacted>@db.internal:5432/results"),
    (REDIS_URL, "redis://cache:<redacted>@10.0.0.5:6379/0"),
    ("redis://:only-a-password@cache:6379", "redis://:<redacted>@cache:6379"),
    ("https://user:1234@host/x", "https://user:<redacted>@host/x"),  # a password of digits is a password
])
def test_a_urls_password_alone_is_replaced(value: str, kept: str) -> None:
    assert redact_value(value) == kept
    assert redact_value(kept) == kept  # redacting twice changes nothing


@pytest.mark.parametrize("value", [
    "/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64:/usr/lib", "/opt/NVIDIA/cuda12/lib64",
    "/data/Llama3/Meta8B/Instruct70B/v2", "/home/User1/Data/Model7B/checkpoints",
    "/var/run/nvidia-topologyd/virtualTopology.xml", "MyProject/SubModule/HelperClass", "Release/Version2/Build",
    "=mlx5_0:1,mlx5_3:1", "mlx5_0:1", "=mlx5_0,mlx5_3", "42", "3.14", "0", "1e-5", "eth0", "ib0,ib1", "Ring",
    "node01.cluster.example.com", "compute-node-001.datacenter-east.example-corp", "node[01-04]", "10.0.0.1",
    "localhost:29500", "expandable_segments:True,max_split_size_mb:128", "INIT,BOOTSTRAP,ENV,NET",
    "8.0;9.0+PTX", "GPU-5f0e2a57-7d2c-4bb4-9d0b-0f1c7a9e1b11,1", "https://example.org:8080/path",
    "http://host:8080/a@b", "https://user@host/x", "timeout:1 attempts:2", "a=b", "foo=bar,baz=qux",
    "0123456789abcdef0123456789abcdef01234567", "v1.2.3-rc.4", "SHARDED_STATE_DICT", "smollm2-135m",
])
def test_ordinary_values_are_kept(value: str) -> None:
    assert redact_value(value) == value


def test_the_capture_redacts_by_name_and_by_value_and_keeps_the_rest() -> None:
    env = {name: value for name, value, _ in SECRETS} | {"NCCL_IB_HCA": "=mlx5_0", "OMP_NUM_THREADS": "4",
                                                          "LD_LIBRARY_PATH": "/usr/local/cuda/lib64:/usr/lib"}
    out = relevant_env(env)
    assert "HF_TOKEN" not in out and "WANDB_API_KEY" not in out and "DATABASE_URL" not in out  # not recorded
    assert out["NCCL_SBENCH_TEST_CRED_X"] == REDACTED and out["ACCELERATE_REMOTE_ID"] == REDACTED
    assert out["TORCH_STORE_URL"] == "redis://cache:<redacted>@10.0.0.5:6379/0"
    assert out["NCCL_IB_HCA"] == "=mlx5_0" and out["OMP_NUM_THREADS"] == "4"
    assert out["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64:/usr/lib"


# -- render: values only in env/<host>.sh, mode 0600 --------------------------------------------------------

def secret_sweep(campaign: str, model: Path, data: Path) -> dict[str, Any]:
    return {"campaign": campaign, "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
            "entity": {"model_name": "tiny", "model_max_length": 64, "dataset_id": SMALL_DATASET,
                       "gradient_accumulation_steps": 1, "batch_size": 2, "max_steps": 2},
            "grid": {"number_gpus": [1]}, "model_map": {"tiny": str(model)}, "data_dir": str(data),
            "runner": {"sample_interval_s": 0.5}}


def files_holding_secrets(root: Path) -> dict[Path, list[str]]:
    """Every file under *root* whose bytes hold a secret (a symlink is not followed), with which."""
    found: dict[Path, list[str]] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                continue
            data = p.read_bytes()
            hits = [s for s in NEVER if s.encode() in data]
            if hits:
                found[p] = hits
    return found


def others_may_read(p: Path) -> bool:
    return bool(p.stat().st_mode & 0o077)


def test_render_writes_values_only_into_env_files_of_mode_0600(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(secret_inventory()))
    sweep = write_yaml(tmp_path / "s.yaml", secret_sweep("sec", tmp_path / "model", tmp_path / "data"))
    out = tmp_path / "out"
    res = sbench("render", sweep, "-i", inv, "-o", out, in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    (job,) = [p for p in out.iterdir() if p.is_dir()]
    paths = JobPaths(job)
    holders = files_holding_secrets(out)
    assert set(holders) == {paths.env("h1")}, holders  # spec.json, launch.sh, job.sbatch: none
    assert set(holders[paths.env("h1")]) == set(NEVER)  # the job gets every one of them
    assert stat.S_IMODE(paths.env("h1").stat().st_mode) == 0o600
    assert stat.S_IMODE(paths.env_dir.stat().st_mode) == 0o700
    spec = json.loads(paths.spec.read_text())
    names = {name for name, _, _ in SECRETS}
    assert names <= set(spec["jobspec"]["env"]) | set(spec["jobspec"]["host_env"]["h1"])  # the names, recorded
    assert "HF_TOKEN" in spec["inventory"]["env"] and "DATABASE_URL" in spec["inventory"]["partitions"]["cpu"]["env"]
    # Rendering again over the same directory keeps the mode (the new file is never readable by others).
    sbench("render", sweep, "-i", inv, "-o", out, in_process=True)
    assert stat.S_IMODE(paths.env("h1").stat().st_mode) == 0o600


def db_text(db: Path) -> str:
    """Every value of every table of *db*, as text."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                            "WHERE table_schema = 'main' AND table_type = 'BASE TABLE'").fetchall()]
        assert "environment" in tables and "runs" in tables
        return "\n".join(repr(con.execute(f'SELECT * FROM "{t}"').fetchall()) for t in tables)
    finally:
        con.close()


@pytest.mark.train
def test_a_real_local_run_gets_its_secrets_and_writes_none_where_others_read(trained: Trained) -> None:
    """Real local executor (the session's trained campaigns: their inventory holds every secret, and a python
    wrapper records the hash of the HF_TOKEN each interpreter of the jobs saw, outside the work dir): after the
    runs and a collect, no secret is in any job-dir file but env/<host>.sh (0600), and none is in the database;
    recorded variables show the name with the value redacted."""
    runs = sql_rows(trained.db, "SELECT * FROM runs")
    assert len(runs) == 4 and all(r["outcome"] == "ok" for r in runs), runs
    # The jobs had the value: every python they started saw the very token.
    seen = {p.read_text().strip() for p in trained.marks.iterdir()}
    assert seen == {hashlib.sha256(HF_TOKEN.encode()).hexdigest()}
    holders = files_holding_secrets(trained.workdir)
    assert set(holders) == {JobPaths(r["job_dir"]).env("h1") for r in runs}, holders
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in holders)
    assert not [p for p in holders if others_may_read(p)]
    assert not files_holding_secrets(trained.marks)  # the hashes are no secret
    text = db_text(trained.db)
    assert not [s for s in NEVER if s in text]
    # The capture records the allow-listed names, the credentials redacted, the URL keeping its host.
    paths = JobPaths(runs[0]["job_dir"])
    for doc in (json.loads(paths.environment("h1").read_text())["env"],
                json.loads(paths.rank_result(0).read_text())["env"],
                *(json.loads(r["env"]) for r in sql_rows(trained.db, "SELECT env FROM environment"))):
        assert doc["NCCL_SBENCH_TEST_CRED_X"] == REDACTED and doc["ACCELERATE_REMOTE_ID"] == REDACTED
        assert doc["TORCH_STORE_URL"] == "redis://cache:<redacted>@10.0.0.5:6379/0"
        assert doc["OMP_NUM_THREADS"] == "1"
        assert "HF_TOKEN" not in doc


@pytest.mark.slurm
@pytest.mark.train
def test_a_slurm_job_gets_its_secrets_through_the_0600_env_file(tmp_path: Path, tiny_model, small_data_dir,
                                                                slurm_cluster) -> None:
    """The test cluster: each node's task sources its 0600 env file; the recorded variables show the names
    with the values redacted, and no file others read nor the database holds a value."""
    doc = yaml.safe_load(TEST_INVENTORY.read_text())
    doc["defaults"]["env"].update({"HF_TOKEN": HF_TOKEN, "WANDB_API_KEY": WANDB_KEY, "DATABASE_URL": DB_URL})
    doc["partitions"]["cpu"]["env"] = {"NCCL_SBENCH_TEST_CRED_X": AWS_SECRET, "TORCH_STORE_URL": REDIS_URL,
                                       "ACCELERATE_REMOTE_ID": JWT}
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc))
    # The shared test dirs: the nodes see the same paths (a tmp dir of this process is visible there).
    sweep = write_yaml(tmp_path / "s.yaml", secret_sweep("sec-slurm", tiny_model, small_data_dir))
    wd, db = tmp_path / "runs", tmp_path / "results.duckdb"
    res = sbench("submit", sweep, "-i", inv, "--executor", "slurm", "--wait", "--json", "--workdir", wd, "--db", db,
                 in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    sbench("collect", "--workdir", wd, "--db", db, in_process=True)
    (run,) = sql_rows(db, "SELECT * FROM runs WHERE campaign = 'sec-slurm'")
    assert run["outcome"] == "ok", run
    paths = JobPaths(run["job_dir"])
    holders = files_holding_secrets(wd)
    assert holders and all(p.parent == paths.env_dir for p in holders), holders
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in holders)
    assert not [s for s in NEVER if s in db_text(db)]
    (host,) = paths.environment_hosts()
    env = json.loads(paths.environment(host).read_text())["env"]
    assert env["NCCL_SBENCH_TEST_CRED_X"] == REDACTED and env["ACCELERATE_REMOTE_ID"] == REDACTED
    assert env["TORCH_STORE_URL"] == "redis://cache:<redacted>@10.0.0.5:6379/0"
