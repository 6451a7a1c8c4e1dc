"""Submit's decisions and the SLURM array script, without a scheduler."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path

import pytest

from harness.campaign.decisions import Decision, DecisionKind
from harness.campaign.repeats import MORE, PRECISE, RepeatsVerdict
from harness.campaign.state import AttemptState, MeasuredRun, PointHistory
from harness.campaign.submit import (
    Mode,
    SubmitRequest,
    _decisions,
    decide,
    plain_policy,
    repeats_policy,
    search_policy,
)
from harness.spec.plan import PlannedPoint
from harness.spec.search import SearchDecision, SearchState
from harness.spec.sweep import AdaptiveRepeats


def point(pid: str, repeat: int = 0, valid: bool = True) -> PlannedPoint:
    return PlannedPoint(point_id=pid, repeat=repeat, experiment="e", entity={}, valid=valid,
                        reasons=[] if valid else ["rule 1: x"], notes=[], partition="p", model_source="m")


def history(runs: dict, elsewhere: dict | None = None) -> PointHistory:
    h = PointHistory(elsewhere={pid: [MeasuredRun(c, f"{c}/{pid}.r{i}.a1", o) for i, (c, o) in enumerate(runs_)]
                                for pid, runs_ in (elsewhere or {}).items()})
    for (pid, rep), attempts in runs.items():
        h.by_run[("c", pid, rep)] = [AttemptState(a, f"j{a}", s, o, r) for a, s, o, r in attempts]
    return h


def test_decisions() -> None:
    pts = [point("new"), point("done"), point("running"), point("failed"), point("invalid", valid=False),
           point("elsewhere"), point("oom"), point("forced-then-failed")]
    h = history({
        ("done", 0): [(1, "COMPLETED", "ok", None)],
        ("running", 0): [(1, "RUNNING", None, None)],
        ("failed", 0): [(1, "FAILED", "failed", "ImportError: bitsandbytes")],
        ("oom", 0): [(1, "FAILED", "invalid", "OutOfMemoryError")],
        ("forced-then-failed", 0): [(1, "COMPLETED", "ok", None), (2, "FAILED", "failed", "x")],
    }, elsewhere={"done": [("other", "ok")], "elsewhere": [("other", "ok")], "oom": [("other", "invalid")]})
    d = {x.point.point_id: x for x in decide(pts, h, "c", force=False, retry_failed=False)}
    assert (d["new"].action, d["new"].attempt, d["new"].reason) == ("submit", 1, "new")
    assert d["done"].action == "skip" and "already measured in this campaign (attempt 1 ended ok)" in d["done"].reason
    assert d["running"].action == "skip" and "RUNNING" in d["running"].reason
    assert d["failed"].action == "skip" and "use --retry-failed" in d["failed"].reason
    assert d["invalid"].action == "skip" and d["invalid"].reason.startswith("invalid: rule 1")
    # measured in another campaign only: this campaign measures it (reuse is opt-in)
    assert (d["elsewhere"].action, d["elsewhere"].attempt, d["elsewhere"].reused) == ("submit", 1, None)
    assert d["oom"].action == "skip"  # an invalid (OOM) measurement is a result, not a failure
    # a measurement of this campaign stays one, even when a later (forced) attempt failed
    assert d["forced-then-failed"].action == "skip" and "attempt 1 ended ok" in d["forced-then-failed"].reason
    r = {x.point.point_id: x for x in decide(pts, h, "c", force=False, retry_failed=True)}
    assert (r["failed"].action, r["failed"].attempt, r["failed"].reason) == ("submit", 2, "retry")
    assert r["done"].action == "skip" and r["oom"].action == "skip"
    f = {x.point.point_id: x for x in decide(pts, h, "c", force=True, retry_failed=False)}
    assert (f["done"].action, f["done"].attempt, f["done"].reason) == ("submit", 2, "force")
    assert f["invalid"].action == "skip"  # force never runs a point the rules reject


def test_reuse_is_opt_in_and_names_the_run_it_takes() -> None:
    pts = [point("elsewhere"), point("done"), point("failed"), point("nowhere"), point("running")]
    h = history({("done", 0): [(1, "COMPLETED", "ok", None)],
                 ("failed", 0): [(1, "FAILED", "failed", "boom")],
                 ("running", 0): [(1, "PENDING", None, None)]},
                elsewhere={"elsewhere": [("nightly-1", "ok")], "done": [("nightly-1", "ok")],
                           "failed": [("nightly-1", "invalid")], "running": [("nightly-1", "ok")]})
    d = {x.point.point_id: x for x in decide(pts, h, "c", force=False, retry_failed=False, reuse=True)}
    e = d["elsewhere"]
    assert e.action == "skip" and e.reused is not None
    assert (e.reused.campaign, e.reused.run_id) == ("nightly-1", "nightly-1/elsewhere.r0.a1")
    assert "reused run nightly-1/elsewhere.r0.a1 of campaign nightly-1 (ok)" in e.reason
    assert d["done"].reused is None and "already measured in this campaign" in d["done"].reason
    assert d["failed"].action == "skip" and d["failed"].reused.outcome == "invalid"  # a result stands for a failure
    assert d["nowhere"].action == "submit" and d["nowhere"].reused is None
    assert d["running"].reused is None and "PENDING" in d["running"].reason  # its own attempt is in flight
    f = {x.point.point_id: x for x in decide(pts, h, "c", force=True, retry_failed=False, reuse=True)}
    assert f["elsewhere"].action == "submit" and f["elsewhere"].reused is None  # --force measures here


def test_repeats_count_measurements() -> None:
    pts = [point("p", 0), point("p", 1), point("p", 2)]
    h = history({("p", 0): [(1, "COMPLETED", "ok", None)]}, elsewhere={"p": [("a", "ok"), ("b", "ok")]})
    assert [x.action for x in decide(pts, h, "c", force=False, retry_failed=False)] == ["skip", "submit", "submit"]
    # reusing: each repeat takes its own run of the point, oldest first; a repeat nothing measured runs
    d = decide(pts, h, "c", force=False, retry_failed=False, reuse=True)
    assert [x.action for x in d] == ["skip", "skip", "submit"]
    assert d[0].reused is None and d[1].reused is not None and d[1].reused.campaign == "b"


K = DecisionKind


def attempts(*rows: tuple) -> list[AttemptState]:
    return [AttemptState(a, f"j{a}", s, o, r, cancelled=c) for a, s, o, r, c in rows]


def test_plain_policy_reads_a_points_attempts_only() -> None:
    p = point("p")
    taken = MeasuredRun("other", "other/p.r0.a1", "ok")
    failed = attempts((1, "FAILED", "failed", "boom", False))
    cancelled = attempts((1, "CANCELLED", "failed", "cancelled", True))
    cases = [  # (attempts, keywords) -> (kind, action, attempt, reason)
        ([], {}, (K.NEW, "submit", 1, "new")),
        ([], {"taken": taken}, (K.REUSED, "skip", 0, "reused run other/p.r0.a1 of campaign other (ok); measure it "
                                                   "here with --force")),
        (attempts((1, "RUNNING", None, None, False)), {}, (K.IN_FLIGHT, "skip", 0, "attempt 1 is RUNNING (job j1)")),
        (attempts((1, "RUNNING", None, None, False)), {"force": True}, (K.FORCE, "submit", 2, "force")),
        (attempts((1, "COMPLETED", "ok", None, False)), {}, (
            K.MEASURED, "skip", 0, "already measured in this campaign (attempt 1 ended ok); use --force to measure it "
                                   "again")),
        (failed, {}, (K.FAILED, "skip", 0, "attempt 1 failed (boom); use --retry-failed")),
        (failed, {"retry_failed": True}, (K.RETRY, "submit", 2, "retry")),
        (cancelled, {"retry_failed": True}, (
            K.CANCELLED, "skip", 0, "attempt 1 was cancelled with sbench cancel; use --force to run it again")),
        (cancelled, {"retry_failed": True, "retry_cancelled": True}, (K.RETRY, "submit", 2, "retry")),
    ]
    for rows, kw, want in cases:
        d = plain_policy(p, rows, **{"force": False, "retry_failed": False, **kw})
        assert (d.kind, d.action, d.attempt, d.reason) == want, (rows, kw)
    bad = plain_policy(point("bad", valid=False), [], force=True, retry_failed=True)
    assert (bad.kind, bad.reason) == (K.INVALID, "invalid: rule 1: x")  # force never runs what the rules reject


def test_repeats_policy_adds_only_the_repeat_the_cv_asks_for() -> None:
    spec = AdaptiveRepeats(2, 4, 0.02)
    more = RepeatsVerdict("p", 2, 0, 2, 0.2, 0.02, 4, MORE, next_repeat=2)
    d = repeats_policy(point("p", 2), [], spec, more, force=False, retry_failed=False)
    assert d is not None and (d.kind, d.action, d.attempt) == (K.MORE_REPEATS, "submit", 1)
    assert d.reason == f"more repeats: {more.text()}"
    # not its next repeat, or a precise point: no decision (no run of the campaign yet)
    assert repeats_policy(point("p", 3), [], spec, more, force=False, retry_failed=False) is None
    precise = RepeatsVerdict("p", 2, 0, 2, 0.001, 0.02, 4, PRECISE)
    assert repeats_policy(point("p", 2), [], spec, precise, force=False, retry_failed=False) is None
    # within min, or a repeat with attempts: the plain policy
    assert repeats_policy(point("p", 0), [], spec, None, force=False, retry_failed=False).kind is K.NEW
    rows = attempts((1, "FAILED", "failed", "x", False))
    assert repeats_policy(point("p", 2), rows, spec, more, force=False, retry_failed=True).kind is K.RETRY


def test_search_policy_runs_what_the_search_asks_for() -> None:
    d = search_policy(point("a"), [], "bisection: runs batch 4", 1 / 9, force=False, retry_failed=False)
    assert d is not None and (d.kind, d.reason, d.attempt) == (K.SEARCH, "search: bisection: runs batch 4", 1)
    assert d.scale == pytest.approx(1 / 9)
    assert search_policy(point("b"), [], None, 1.0, force=False, retry_failed=False) is None  # not asked for
    bad = search_policy(point("bad", valid=False), [], None, 1.0, force=False, retry_failed=False)
    assert bad is not None and bad.kind is K.INVALID  # an invalid point's first repeat says why it is none
    assert search_policy(point("bad", 1, valid=False), [], None, 1.0, force=False, retry_failed=False) is None
    # a search's cancelled run: retry goes on with it, at the length the search gives it
    cancelled = attempts((1, "CANCELLED", "failed", "cancelled", True))
    assert search_policy(point("c"), cancelled, None, 1.0, force=False, retry_failed=False).kind is K.CANCELLED
    r = search_policy(point("c"), cancelled, None, 1 / 3, force=False, retry_failed=True)
    assert r is not None and (r.kind, r.reason, r.attempt, r.scale) == (K.RETRY, "retry", 2, pytest.approx(1 / 3))


def test_decide_dispatches_to_the_sweeps_policy() -> None:
    pts = [point("p", r) for r in range(3)]
    h = history({("p", 0): [(1, "COMPLETED", "ok", None)], ("p", 1): [(1, "COMPLETED", "ok", None)]})
    h.stability["p"] = (2, 0.2)
    assert [d.kind for d in decide(pts, h, "c", force=False, retry_failed=False)] == [K.MEASURED, K.MEASURED, K.NEW]
    adaptive = decide(pts, h, "c", force=False, retry_failed=False, adaptive=AdaptiveRepeats(2, 3, 0.02))
    assert [d.kind for d in adaptive] == [K.MEASURED, K.MEASURED, K.MORE_REPEATS]
    st = SearchState(todo=[("p", 2)], decisions={"p": SearchDecision("p", "final", "run", "best", 2)})
    assert [d.kind for d in decide(pts, h, "c", force=False, retry_failed=False, search=st)] == \
        [K.MEASURED, K.MEASURED, K.SEARCH]


def test_the_kinds_that_submit() -> None:
    assert {k for k in K if k.submits} == {K.NEW, K.RETRY, K.FORCE, K.MORE_REPEATS, K.SEARCH}
    assert Decision(point("p"), K.NOT_FAILED, "not failed").action == "skip"
    assert Decision(point("p"), K.MORE_REPEATS, "more repeats: x", 1).action == "submit"


def test_retry_and_next_runs_choose_by_kind() -> None:
    """retry sends only the failed runs (another submission becomes "not failed"; an adaptive repeat is left out);
    collect's next runs send only what adaptive repeats or a search ask for."""
    pts = [point("failed"), point("new"), point("done"), point("noisy", 0), point("noisy", 1), point("noisy", 2)]
    h = history({("failed", 0): [(1, "FAILED", "failed", "x")], ("done", 0): [(1, "COMPLETED", "ok", None)],
                 ("noisy", 0): [(1, "COMPLETED", "ok", None)], ("noisy", 1): [(1, "COMPLETED", "ok", None)]})
    h.stability["noisy"] = (2, 0.2)
    sweep = types.SimpleNamespace(campaign="c", adaptive=AdaptiveRepeats(2, 3, 0.02), source="s.yaml")
    plan = types.SimpleNamespace(sweep=sweep, points=pts)
    req = SubmitRequest(Path("s.yaml"))

    def chosen(mode: Mode) -> list[tuple[str, int, DecisionKind, str]]:
        return [(d.point.point_id, d.point.repeat, d.kind, d.reason)
                for d in _decisions(req, mode, plan, h, False)]  # (of the plan, only its sweep and points are read)

    everything = chosen(Mode.SUBMIT)
    assert [(k[0], k[2]) for k in everything] == [("failed", K.FAILED), ("new", K.NEW), ("done", K.MEASURED),
                                                  ("noisy", K.MEASURED), ("noisy", K.MEASURED),
                                                  ("noisy", K.MORE_REPEATS)]
    retry = chosen(Mode.RETRY)
    assert [(k[0], k[2], k[3]) for k in retry if k[2].submits] == [("failed", K.RETRY, "retry")]
    assert ("new", 0, K.NOT_FAILED, "not failed") in retry and not any(k[2] is K.MORE_REPEATS for k in retry)
    assert len(retry) == 5
    assert [(k[0], k[1], k[2]) for k in chosen(Mode.DUE)] == [("noisy", 2, K.MORE_REPEATS)]
    assert not {"only_failed", "only_more"} & {f.name for f in dataclasses.fields(SubmitRequest)}


def test_array_script_runs_each_points_own_job_sbatch(tmp_path: Path) -> None:
    from harness.build.render import render_points
    from harness.build.sbatch import array_sbatch
    from harness.campaign.executors.slurm import group_by_shape
    from harness.spec.inventory import load_inventory
    from harness.spec.plan import plan_sweep
    from harness.spec.sweep import parse_sweep

    from .kit import TEST_INVENTORY

    doc = {"campaign": "arr", "experiment": "finetune_full_benchmark-v1.0.0", "partition": "gpu",
           "entity": {"model_name": "smollm2-135m", "model_max_length": 256},
           "grid": {"batch_size": [8, 16, 24], "number_gpus": [1, 8]}}
    sweep = parse_sweep(doc, "s.yaml", tmp_path)
    inv = load_inventory(TEST_INVENTORY)
    specs = render_points(sweep, inv, plan_sweep(sweep, inv), tmp_path / "out")
    groups = group_by_shape(specs)
    assert sorted(len(g) for g in groups) == [3, 3]
    text = array_sbatch("arr", groups[0], 2, tmp_path / "logs")
    lines = text.splitlines()
    assert "#SBATCH --array=0-2%2" in lines
    own = [x for x in Path(groups[0][0].job_dir, "job.sbatch").read_text().splitlines() if x.startswith("#SBATCH")]
    for d in own:  # every directive of the point's own script, except its name and output file
        if not d.startswith(("#SBATCH --job-name", "#SBATCH --output")):
            assert d in lines, d
    assert lines[-1] == 'exec bash "$JOB_DIR/job.sbatch"'
    for s in groups[0]:
        assert s.job_dir in text


def test_local_inventory_reads_gpus_through_nvml(monkeypatch) -> None:
    """A fake NVML module (the real one needs a driver): the local inventory becomes a GPU partition."""
    fake = types.ModuleType("pynvml")
    names = ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]

    class Mem:
        total = 80 * 2**30

    fake.nvmlInit = lambda: None
    fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: len(names)
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetName = lambda h: names[h]
    fake.nvmlDeviceGetMemoryInfo = lambda h: Mem()
    fake.nvmlDeviceGetUUID = lambda h: f"GPU-{h:04d}"
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    from harness.spec.inventory import local_inventory

    part = local_inventory().partitions["local"]
    assert part.gpu_model == "NVIDIA-H100-80GB-HBM3" and part.gpus_per_node == 2 and not part.is_cpu


@pytest.mark.parametrize("text,minutes", [("90", 90), ("01:30:00", 90), ("1-00:00:00", 1440), ("10:30", 10.5)])
def test_slurm_time(text: str, minutes: float) -> None:
    from harness.campaign.executors.local import slurm_time_minutes

    assert slurm_time_minutes(text) == minutes


def test_submit_refreshes_only_what_may_have_moved(tmp_path: Path) -> None:
    """Submit's view of a campaign: no collect when every attempt has settled; only the attempts the
    database lacks, or that the executor no longer reports queued or running, otherwise."""
    import json

    from harness.campaign.refresh import runs_to_refresh
    from harness.collect import collect
    from harness.contract.paths import CampaignPaths
    from harness.slurm.client import Slurm

    from .kit.jobdirs import append_manifest, local_process, make_run, write_json

    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    assert runs_to_refresh(db, wd, "c", Slurm()) is None  # no database yet: everything
    done = make_run(wd, "c", 0, hosts=("n1",), gpus_per_host=1, ticks=5, executor="local", job_id="999991")
    append_manifest(wd, "c", done["events"])
    queued = make_run(wd, "c", 1, hosts=("n1",), gpus_per_host=1, ticks=5, executor="local", job_id=None)
    for f in queued["paths"].root.iterdir():
        if f.name.startswith(("result.", "rank.", "stages.")):
            f.unlink()
    append_manifest(wd, "c", queued["events"])
    qfile = wd / "c" / ".local" / "queue-1.json"
    qfile.parent.mkdir(parents=True)
    queue = local_process(qfile, "queue")  # its live queue: collect sees it waiting
    try:
        CampaignPaths.queue_pidfile(qfile).write_text(json.dumps({"pid": queue.pid}))
        write_json(queued["paths"].submitted, {"executor": "local", "job_id": None, "queue": str(qfile)})
        collect(db, wd)
        from harness.contract.paths import run_id

        rid = {r["point_id"]: run_id("c", r["point_id"], 0, 1) for r in (done, queued)}
        # the executor says the queued one is still waiting (no pid yet): nothing to read
        assert runs_to_refresh(db, wd, "c", Slurm()) == []
    finally:
        queue.kill()
    # it ended since: that run alone
    write_json(queued["paths"].submitted, {"executor": "local", "job_id": "12", "exit_code": 1,
                                           "ended_at": "2025-11-22T00:10:00+0000"})
    assert runs_to_refresh(db, wd, "c", Slurm()) == [rid[queued["point_id"]]]
    # an attempt the database has never seen
    extra = make_run(wd, "c", 2, hosts=("n1",), gpus_per_host=1, ticks=5, executor="local", job_id="999993")
    append_manifest(wd, "c", extra["events"])
    assert sorted(runs_to_refresh(db, wd, "c", Slurm())) == \
        sorted([rid[queued["point_id"]], run_id("c", extra["point_id"], 0, 1)])
