"""The campaign directory has one owner (harness.contract.paths.CampaignPaths): it names every file and folder,
and lists campaigns the one way; the facts around it each have one home (the job states, the executor's name
asked of its backend only)."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from harness.campaign.executors.registry import BACKENDS
from harness.contract import jobstate
from harness.contract.paths import CampaignPaths, JobPaths

PACKAGE = Path(__file__).resolve().parent.parent / "harness"


def _package_text() -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*") if p.is_file()
            and p.suffix in (".py", ".j2", ".yaml")}


def test_every_file_of_a_campaign_directory_is_named_once_in_the_package() -> None:
    text = _package_text()
    for name in ("manifest.jsonl", ".submitit", ".slurm", ".local", "prepare-job.json", "feed.json",
                 "feed.sbatch"):
        where = [f"{p.relative_to(PACKAGE)}:{i}" for p, t in text.items() for i, line in
                 enumerate(t.splitlines(), 1) if re.search(rf"""["']{re.escape(name)}["']""", line)]
        assert len(where) == 1 and where[0].startswith("contract/paths.py"), (name, where)


def test_campaign_paths_name_the_files_and_folders(tmp_path: Path) -> None:
    camp = CampaignPaths.of(tmp_path, "scan")
    root = tmp_path / "scan"
    assert camp.name == "scan" and camp.root == root
    assert camp.manifest == root / "manifest.jsonl" and camp.lock == root / ".lock"
    assert camp.prepare_job == root / "prepare-job.json" and camp.prepare_log("7") == root / ".slurm" / "prepare-7.out"
    assert camp.feed == root / ".slurm" / "feed.json" and camp.feed_script == root / ".slurm" / "feed.sbatch"
    assert camp.submissions == root / ".submitit" and camp.local_submitit == root / ".local" / "submitit"
    queue = camp.queue("20260101T000000-1")
    assert queue == root / ".local" / "queue-20260101T000000-1.json"
    assert camp.queue_log("20260101T000000-1") == root / ".local" / "queue-20260101T000000-1.log"
    assert CampaignPaths.queue_pidfile(queue) == root / ".local" / "queue-20260101T000000-1.pid"
    assert CampaignPaths.of_queue(queue).root == root
    job = camp.job("0123456789abcdef", 2, 3)
    assert isinstance(job, JobPaths) and job.root == root / "0123456789abcdef.r2.a3"


def test_campaigns_are_listed_one_way(tmp_path: Path) -> None:
    for name in ("b", "a", ".fabric", "c"):
        (tmp_path / name).mkdir()
    (tmp_path / "file").write_text("")
    CampaignPaths.of(tmp_path, "b").manifest.write_text("")
    os.symlink(tmp_path / "nowhere", tmp_path / "a" / "manifest.jsonl")  # a link to nothing: listed, said unread
    assert [c.name for c in CampaignPaths.listed(tmp_path)] == ["a", "b", "c"]
    assert [c.name for c in CampaignPaths.listed(tmp_path, submitted=True)] == ["a", "b"]
    assert [c.name for c in CampaignPaths.listed(tmp_path, "c")] == ["c"]
    assert CampaignPaths.listed(tmp_path, "missing") == [] and CampaignPaths.listed(tmp_path, "file") == []
    assert CampaignPaths.listed(tmp_path / "none") == []


def test_the_job_states_of_requeue_start_and_never_running_live_in_the_state_table() -> None:
    assert jobstate.REQUEUE_STATES == {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PREEMPTED", "NODE_FAIL"}
    assert jobstate.STATES[jobstate.INITIAL].phase == "pending"
    assert jobstate.NEVER_RAN_STATES <= set(jobstate.FAILURE_STATES)
    text = _package_text()
    initial = [str(p.relative_to(PACKAGE)) for p, t in text.items() if re.search(r"""["']SUBMITTED["']""", t)]
    assert initial == ["contract/jobstate.py"], initial


def test_submit_asks_its_backend_and_never_compares_an_executors_name() -> None:
    tree = ast.parse((PACKAGE / "campaign" / "submit.py").read_text(encoding="utf-8"))
    names = set(BACKENDS) | {"auto"}
    compared = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                and any(isinstance(c, ast.Constant) and c.value in names for c in [node.left, *node.comparators])]
    assert compared == []


def test_a_pack_asks_build_about_the_job_spec_not_the_node_runner() -> None:
    tree = ast.parse((PACKAGE / "campaign" / "executors" / "pack.py").read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(m.startswith("harness.runner") for m in imported), imported
