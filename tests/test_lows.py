"""Small things a new user meets: numbers written in scientific notation, the bounds of fractions said as they
are checked, adaptive repeats that need two, compare of one campaign with itself or with one the database lacks,
a sweep with no valid point, a requeued pack point's reason, and which points share a pack before submitting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.campaign.executors.pack import REQUEUE_REASON, requeued_locally
from harness.campaign.manifest import read as read_manifest
from harness.campaign.repeats import MORE, WAITING, point_verdicts
from harness.campaign.state import AttemptState, PointHistory, with_submitted
from harness.collect.ingest import collect
from harness.contract.paths import JobPaths, job_dir_name
from harness.spec.sweep import AdaptiveRepeats

from . import kit
from .kit import sql_rows, write_yaml
from .kit.jobdirs import append_manifest, make_run, manifest_events, write_spec

BASE = {"campaign": "lows", "experiment": "finetune_full_benchmark-v1.0.0",
        "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 1, "batch_size": 2,
                   "max_steps": 4}}
PRECISION = {"entity": {**BASE["entity"], "auto_stop_method": "WARMUP_60S_STABLE_120S_OR_10_STEPS"}}


def plan_text(cli, tmp_path: Path, text: str, extra: str = "") -> tuple[int, str]:
    """``sbench plan`` of a sweep written as YAML text (so that 1e12 stays as the user typed it)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(f"campaign: lows\nexperiment: finetune_full_benchmark-v1.0.0\nentity: {{model_name: smollm2-135m, "
                    f"model_max_length: 64, number_gpus: 1, batch_size: 2, max_steps: 4{extra}}}\n{text}")
    res = cli("plan", path)
    return res.exit_code, res.output


def test_a_number_in_scientific_notation_is_a_number(cli, tmp_path: Path) -> None:
    auto = ", auto_stop_method: WARMUP_60S_STABLE_120S_OR_10_STEPS"
    code, out = plan_text(cli, tmp_path, "runner: {auto_stop: {method: precision, max_seconds: 1e12}}\n", auto)
    # judged as the number it is (a day at most), not refused as text
    assert code == 2 and "runner.auto_stop.max_seconds" in out and "<= 86400" in out and "Traceback" not in out
    code, out = plan_text(cli, tmp_path, "runner: {auto_stop: {method: precision, rel_ci: 5e-2, max_seconds: 6e2}}\n",
                          auto)
    assert code == 0, out
    # quoted, it is text, as YAML says
    code, out = plan_text(cli, tmp_path, "runner: {auto_stop: {method: precision, max_seconds: '600'}}\n", auto)
    assert code == 2 and "must be a number" in out


@pytest.mark.parametrize("repeats,key,fix", [
    ({"min": 1, "max": 3, "cv": 0.02}, "repeats.min", "must be >= 2 with cv"),
    ({"min": 2, "max": 3, "cv": -0.1}, "repeats.cv", "between 0 and 1, both excluded"),
    ({"min": 2, "max": 3, "cv": 0}, "repeats.cv", "between 0 and 1, both excluded"),
])
def test_repeats_bounds_say_what_is_checked(cli, tmp_path: Path, repeats, key, fix) -> None:
    sw = write_yaml(tmp_path / "sweep.yaml", {**BASE, "repeats": repeats})
    res = cli("plan", sw)
    assert res.exit_code == 2 and str(sw) in res.output and key in res.output and fix in res.output, res.output
    assert "must be >= 0" not in res.output


@pytest.mark.parametrize("rel_ci,ok", [(1, False), (0.6, False), (0, False), (0.5, True), (0.02, True)])
def test_rel_ci_is_a_precision_not_a_formality(cli, tmp_path: Path, rel_ci, ok) -> None:
    sw = write_yaml(tmp_path / "sweep.yaml", {**BASE, **PRECISION,
                                              "runner": {"auto_stop": {"method": "precision", "rel_ci": rel_ci}}})
    res = cli("plan", sw)
    if ok:
        assert res.exit_code == 0, res.output
    else:
        assert res.exit_code == 2 and "runner.auto_stop.rel_ci" in res.output and "at most 0.5" in res.output


@pytest.fixture
def two_campaigns(tmp_path: Path) -> dict[str, Path]:
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    for camp in ("nightly-a", "nightly-b"):
        r = make_run(wd, camp, 0, hosts=("node1",), gpus_per_host=1, ticks=30)
        append_manifest(wd, camp, [manifest_events(camp, "finetune_full_benchmark-v1.0.0"), *r["events"]])
    collect(db, wd, None)
    return {"wd": wd, "db": db}


def test_compare_of_one_campaign_with_itself_or_with_one_not_there_says_so(cli, two_campaigns) -> None:
    db = two_campaigns["db"]
    same = cli("compare", "nightly-a", "nightly-a", "--db", db)
    assert same.exit_code == 2 and "BASE and CAND are the same ('nightly-a')" in same.output
    missing = cli("compare", "nightly-a", "nightly-c", "--db", db)
    assert missing.exit_code == 2 and "CAND: campaign 'nightly-c' is not in" in missing.output
    assert "its campaigns: nightly-a, nightly-b" in missing.output and "Traceback" not in missing.output


def test_a_sweep_without_a_valid_point_is_refused(cli, tmp_path: Path) -> None:
    inv = write_yaml(tmp_path / "inv.yaml", kit.inventory())
    sw = write_yaml(tmp_path / "sweep.yaml", {**BASE, "entity": {**BASE["entity"], "number_gpus": 4}})
    res = cli("submit", sw, "-i", inv, "--executor", "local", "--workdir", tmp_path / "runs", "--db",
              tmp_path / "r.duckdb")
    assert res.exit_code == 2 and f"{sw}: every point is invalid (1 point(s))" in res.output, res.output
    assert "nothing was submitted" in res.output and "sbench plan" in res.output
    assert not (tmp_path / "runs" / "lows" / "manifest.jsonl").exists()


def test_a_point_its_local_pack_put_back_in_the_queue_says_why(tmp_path: Path) -> None:
    wd = tmp_path / "runs"
    camp = wd / "pk"
    jd = camp / job_dir_name("a" * 16, 0, 1)
    jd.mkdir(parents=True)
    write_spec(JobPaths(jd), "pk", "a" * 16, 0, 1, "finetune_full_benchmark-v1.0.0", {"batch_size": 4})
    append_manifest(wd, "pk", [manifest_events("pk", "finetune_full_benchmark-v1.0.0", "local"),
                               {"type": "attempt", "campaign": "pk", "point_id": "a" * 16, "repeat": 0, "attempt": 1,
                                "job_dir": str(jd), "executor": "local", "job_id": None, "reason": "new"}])
    requeued_locally([jd])
    lines = [e for e in read_manifest(camp) if e.get("type") == "attempt"]
    assert [e["reason"] for e in lines] == ["new", REQUEUE_REASON]
    db = tmp_path / "r.duckdb"
    collect(db, wd, "pk")
    (run,) = sql_rows(db, "SELECT submit_reason FROM runs")
    assert run["submit_reason"] == REQUEUE_REASON


def test_plan_and_render_show_which_points_share_a_pack(cli, tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    doc = {**BASE, "entity": {k: v for k, v in BASE["entity"].items() if k != "batch_size"} | {"model_name": "tiny"},
           "grid": {"batch_size": [4, 1, 2]}, "model_map": {"tiny": str(tmp_path / "model")}, "slurm": {"pack": 2}}
    sw = write_yaml(tmp_path / "sweep.yaml", doc)
    res = cli("plan", sw)
    assert res.exit_code == 0, res.output
    rows = {line.split()[0]: line for line in res.output.splitlines() if "valid" not in line and "yes" in line}
    got = json.loads(cli("plan", sw, "--json").output)
    by_batch = {p["entity"]["batch_size"]: p["pack"] for p in got}
    # ascending batch size: 1 and 2 share the first allocation, 4 runs alone
    assert by_batch == {1: "pack 1, 1 of 2", 2: "pack 1, 2 of 2", 4: "alone"}
    assert any("pack 1, 1 of 2" in line for line in rows.values())
    assert "slurm.pack 2: 2 run(s) share 1 allocation(s), 1 run alone" in res.output
    out = cli("render", sw, "-o", tmp_path / "preview")
    assert out.exit_code == 0
    (line,) = [x for x in out.output.splitlines() if x.startswith("pack 1:")]
    assert "2 points in one allocation" in line


@pytest.mark.parametrize("fault,says", [
    ("garbage", "needs KIND@COND"),
    ("sleep@stage=trian:1", "did you mean 'train'"),
    ("sleep@step=1:abc", "sleep's :ARG is seconds"),
    ("oom@step=1:3", "oom takes no :ARG"),
])
def test_a_malformed_fault_is_refused_by_plan_and_submit(cli, tmp_path: Path, monkeypatch, fault, says) -> None:
    inv_doc = kit.inventory()
    inv = write_yaml(tmp_path / "inv.yaml", inv_doc)
    sw = write_yaml(tmp_path / "sweep.yaml", BASE)
    common = ["--workdir", tmp_path / "runs", "--db", tmp_path / "r.duckdb"]
    monkeypatch.setenv("SBENCH_FAULT", fault)
    for args in (("plan", sw, "-i", inv), ("submit", sw, "-i", inv, "--executor", "local", *common)):
        res = cli(*args)
        assert res.exit_code == 2, res.output
        assert "SBENCH_FAULT (this command's environment" in res.output and says in res.output
    assert not (tmp_path / "runs").exists()
    # the same value in the inventory's env (rendered into each job's env/<host>.sh): named by its key
    monkeypatch.delenv("SBENCH_FAULT")
    inv_doc["partitions"]["cpu"]["env"] = {"SBENCH_FAULT": fault}
    write_yaml(inv, inv_doc)
    res = cli("submit", sw, "-i", inv, "--executor", "local", *common)
    assert res.exit_code == 2 and f"{inv}: partitions.cpu.env.SBENCH_FAULT" in res.output and says in res.output
    inv_doc["partitions"]["cpu"]["env"] = {"SBENCH_FAULT": "sleep@step=1:2;oom@step=3,rank=0"}
    write_yaml(inv, inv_doc)
    assert cli("plan", sw, "-i", inv).exit_code == 0


def test_the_repeats_summary_is_right_just_after_a_submission() -> None:
    spec = AdaptiveRepeats(2, 4, 0.02)
    # a fresh campaign: its first two repeats were just handed to the executor
    now = with_submitted(PointHistory(), "c", [("p", 0, 1, "41"), ("p", 1, 1, None)])
    (v,) = point_verdicts(spec, ["p"], now, "c").values()
    assert v.state == WAITING and v.in_flight == 2 and v.submitted == 2
    assert v.text().startswith("2 repeat(s) queued or running")
    # a noisy point whose third repeat was just sent: waiting for it, not "repeat 2 is next"
    ok = [AttemptState(1, "j", "COMPLETED", "ok")]
    before = PointHistory(by_run={("c", "p", 0): ok, ("c", "p", 1): ok}, stability={"p": (2, 0.2)})
    (v,) = point_verdicts(spec, ["p"], before, "c").values()
    assert v.state == MORE and v.next_repeat == 2
    (v,) = point_verdicts(spec, ["p"], with_submitted(before, "c", [("p", 2, 1, "43")]), "c").values()
    assert v.state == WAITING and v.in_flight == 1 and "repeat 2 is next" not in v.text()
