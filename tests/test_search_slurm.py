"""A search on the project's test cluster: one ``sbench submit`` (no --wait), cancelled at once and resumed with
``sbench retry``, and the feeder job goes on with the search wave after wave until it is over; ``collect`` then
``sbench best`` answer. The answer is known by
construction (SBENCH_FAULT in the inventory's env: an OOM at batch 4 of one shape, a sleep on every step of every
point but the fastest)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from harness.contract.paths import CampaignPaths
from harness.spec.inventory import load_inventory
from harness.spec.plan import plan_sweep
from harness.spec.sweep import load_sweep

from .kit import SMALL_DATASET, TEST_INVENTORY, sbench, sql_rows, write_yaml

pytestmark = [pytest.mark.slurm, pytest.mark.train]


@pytest.mark.slow(150)
def test_a_search_cancelled_and_resumed_finishes_by_its_feeder(tmp_path: Path, tiny_model: Path, small_data_dir: Path,
                                                        slurm_cluster, monkeypatch) -> None:
    monkeypatch.setenv("SBENCH_FEED_INTERVAL", "2")  # read at submit: the feeder's turns, 2 s apart
    camp = f"search{int(time.time())}"
    common = ["--workdir", str(tmp_path / "runs"), "--db", str(tmp_path / "r.duckdb")]
    def sb(*args: object) -> str:
        return sbench(*args, *common, in_process=True).stdout

    sw = write_yaml(tmp_path / "s.yaml", {
        "campaign": camp, "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "tiny", "model_max_length": 32, "dataset_id": SMALL_DATASET, "max_steps": 3,
                   "number_gpus": 1},
        "grid": {"batch_size": [1, 2, 4], "gradient_accumulation_steps": [1, 2]},
        "search": {"goal": {"maximize": "dataset_tokens_per_second"}, "batch_size": "fit", "method": "halving"},
        "model_map": {"tiny": str(tiny_model)}, "data_dir": str(small_data_dir),
        "runner": {"sample_interval_s": 0.5}, "slurm": {"time": "00:10:00"}})
    inv_doc = yaml.safe_load(TEST_INVENTORY.read_text())
    inv = write_yaml(tmp_path / "inv.yaml", inv_doc)
    points = {(p.entity["gradient_accumulation_steps"], p.entity["batch_size"]): p.point_id
              for p in plan_sweep(load_sweep(sw), load_inventory(inv)) if p.repeat == 0}
    fast, oom = points[(1, 4)], points[(2, 4)]
    inv_doc["partitions"]["cpu"]["env"] = {"SBENCH_FAULT": ";".join(
        [f"oom@step=1,job={oom}."] + [f"sleep@step=*,job={pid}.:1" for pid in points.values()
                                       if pid not in (fast, oom)])}
    write_yaml(inv, inv_doc)

    rep = json.loads(sb("submit", sw, "-i", inv, "--executor", "slurm", "--json"))
    assert rep["feed"].get("feeder_job"), rep["feed"]
    first = sorted(p["point_id"] for p in rep["points"] if p["action"] == "submit")
    # cancelled at once (the feeder first, then the first wave's jobs), then resumed with retry: the search goes on
    # from what the database holds, and its feeder takes it to the same answer
    sb("cancel", "--campaign", camp)
    feed_file = CampaignPaths(tmp_path / "runs" / camp).feed
    assert json.loads(feed_file.read_text()).get("cancelled_at")
    again = json.loads(sb("retry", camp, "--executor", "slurm", "--json"))
    assert sorted(p["point_id"] for p in again["points"] if p["action"] == "submit") == first, again
    assert again["feed"].get("feeder_job"), again["feed"]
    # no further command: the feeder collects, decides and submits until the search is over
    end = time.monotonic() + 400
    while time.monotonic() < end:
        doc = json.loads(feed_file.read_text()) if feed_file.is_file() else {}
        if doc.get("finished_at") and not doc.get("feeder_job"):
            break
        time.sleep(2)
    else:
        pytest.fail(f"the search's feeder did not finish: {feed_file.read_text() if feed_file.is_file() else ''}")
    time.sleep(2)  # sacct trails slurmctld by about a second
    sb("collect", "--campaign", camp)
    ans = json.loads(sb("best", camp, "--json"))
    assert ans["done"] and ans["best"]["point_id"] == fast, ans
    fits = {m["shape"]["gradient_accumulation_steps"]: m for m in ans["max_batch_size"]}
    assert fits[1]["batch_size"] == 4 and (fits[2]["batch_size"], fits[2]["smallest_oom"]) == (2, 4)
    rows = sql_rows(tmp_path / "r.duckdb", "SELECT point_id, repeat, attempt, outcome FROM runs WHERE campaign = ?",
                    [camp])
    last = [r for r in rows if not any(o["point_id"] == r["point_id"] and o["repeat"] == r["repeat"]
                                       and o["attempt"] > r["attempt"] for o in rows)]
    # fewer runs than the grid's points plus the best's repeat, each point's repeat once; only the cancelled first
    # wave ran twice (its attempt 1 cancelled, attempt 2 the retry's)
    assert len(last) < len(points) + 1 and len({(r["point_id"], r["repeat"]) for r in last}) == len(last)
    assert sorted(r["point_id"] for r in rows if r["attempt"] > 1) == first and all(
        r["attempt"] <= 2 for r in rows)
    assert {r["point_id"] for r in last if r["outcome"] == "invalid"} == {oom}
    decided = sql_rows(tmp_path / "r.duckdb", "SELECT point_id FROM search_decisions WHERE campaign = ?", [camp])
    assert {r["point_id"] for r in decided} == set(points.values())
