"""``sbench status`` on the real test cluster: what the scheduler says now, before any collect. Jobs
cancelled while pending (a whole array with ``scancel``, or each task with ``sbench cancel``) read
CANCELLED, never SUBMITTED; one task cancelled alone, of which SLURM keeps no record, reads GONE; the
database is not touched until ``collect``."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from .kit import TEST_INVENTORY, sbench, sql_rows, write_yaml

pytestmark = pytest.mark.slurm


def _sacct_states(array_id: str) -> list[str]:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", array_id], capture_output=True,
                         text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _wait(cond, what: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(1)


def _left_queue(job_id: str) -> bool:
    """squeue answered and does not list *job_id* (a loaded controller that did not answer is no answer)."""
    res = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True)
    return res.returncode == 0 and job_id not in res.stdout.split()


def test_cancelled_while_pending_shows_cancelled_without_a_collect(slurm_cluster, tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    common = ["--workdir", str(tmp_path / "runs"), "--db", str(db)]

    def sb(*args, code=0):
        return sbench(*args, *common, in_process=True, ok=(code,))

    (tmp_path / "model").mkdir()  # held jobs never load it
    reps = {}
    for camp in ("scancelled", "sbcancelled", "onetask"):
        sweep = write_yaml(tmp_path / f"{camp}.yaml", {
            "campaign": camp, "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
            "entity": {"model_name": "tiny", "model_max_length": 64, "max_steps": 1, "number_gpus": 1},
            "grid": {"batch_size": [2, 4]},  # one shape: one array of two tasks
            "model_map": {"tiny": str(tmp_path / "model")}, "data_dir": str(tmp_path / "data")})
        reps[camp] = json.loads(sb("submit", sweep, "-i", TEST_INVENTORY, "--executor", "slurm", "--hold",
                                   "--no-prepare", "--json").stdout)
    arrays = {camp: {p["job_id"].split("_")[0] for p in rep["points"]} for camp, rep in reps.items()}
    try:
        assert all(len(a) == 1 for a in arrays.values()) and all(r["submitted"] == 2 for r in reps.values())
        st = json.loads(sb("status", "--json").stdout)
        assert st["counts"] == {"pending": 6}
        # The whole pending array from outside sbench; another campaign's tasks through sbench cancel.
        (scancelled,) = arrays["scancelled"]
        subprocess.run(["scancel", scancelled], check=True)
        assert "cancelled 2 attempt(s)" in sb("cancel", "--campaign", "sbcancelled").stdout
        # One pending task of an array from outside sbench: SLURM drops it from the array's record of its
        # queued tasks, so neither the queue nor sacct knows it any more.
        (one,) = [p["job_id"] for p in reps["onetask"]["points"] if p["job_id"].endswith("_0")]
        subprocess.run(["scancel", one], check=True)
        for array in (scancelled, *arrays["sbcancelled"]):
            _wait(lambda a=array: _sacct_states(a) and all(s == "CANCELLED" for s in _sacct_states(a)),
                  f"sacct to record array {array} cancelled")
        _wait(lambda: _left_queue(one), f"{one} to leave the queue")
        st = json.loads(sb("status", "--json").stdout)
        rows = {r["job_id"]: r for r in st["rows"] if r["campaign"] in arrays}
        assert len(rows) == 6
        for r in rows.values():
            if r["campaign"] != "onetask":
                assert r["phase"] == "cancelled (not collected)", r
                assert r["live_state"] == "CANCELLED" and r["outcome"] is None
        assert (rows[one]["phase"], rows[one]["live_state"]) == ("gone (not collected)", "GONE")
        assert "without an accounting record" in rows[one]["reason"]
        assert st["counts"] == {"cancelled (not collected)": 4, "gone (not collected)": 1, "pending": 1}
        text = sb("status").stdout
        assert "SUBMITTED" not in text and "4 cancelled (not collected)" in text
        # its last task through sbench cancel, which asks nothing about the one already gone
        assert "cancelled 1 attempt(s)" in sb("cancel", "--campaign", "onetask").stdout
        (other,) = arrays["onetask"]
        _wait(lambda: _sacct_states(other) == ["CANCELLED"], f"sacct to record array {other} cancelled")
        rows = {r["job_id"]: r for r in json.loads(sb("status", "--json").stdout)["rows"] if r["campaign"] in arrays}
        assert [r["phase"] for j, r in rows.items() if j != one] == ["cancelled (not collected)"] * 5
        # (while SLURM's record of the cancelled array briefly names the array alone, it speaks for that task too)
        assert rows[one]["phase"] in ("gone (not collected)", "cancelled (not collected)")
        # status read the scheduler only: the database still has no outcome for them
        assert [r["outcome"] for r in sql_rows(db, "SELECT outcome FROM runs")] == [None] * 6
        sb("collect")
        runs = sql_rows(db, "SELECT campaign, job_id, state, outcome, reason FROM runs ORDER BY campaign, job_id")
        assert [(r["campaign"], r["state"], r["outcome"]) for r in runs if r["job_id"] != one] == \
            [("onetask", "CANCELLED", "failed")] + [("sbcancelled", "CANCELLED", "failed")] * 2 + \
            [("scancelled", "CANCELLED", "failed")] * 2
        assert all("cancel" in r["reason"].lower() for r in runs if r["job_id"] != one)
        (gone,) = [r for r in runs if r["job_id"] == one]
        assert gone["outcome"] == "failed"
        assert json.loads(sb("status", "--json").stdout)["counts"] == {"failed": 6}
    finally:
        # (every array: a task left behind would hold a slot of the quota tests' limits)
        subprocess.run(["scancel", *arrays["scancelled"], *arrays["sbcancelled"], *arrays["onetask"]], check=False)
