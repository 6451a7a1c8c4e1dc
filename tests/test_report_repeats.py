"""The report shows what the last wave added: each point's repeats (how many, the target, the state, why each
was sent), its median and spread, the precision interval and what stopped the runs, energy and tokens per joule;
and ``report --compare A B`` builds its page around A and B. Synthetic job dirs, collected; no training."""

from __future__ import annotations

import re
from pathlib import Path
from statistics import median
from typing import Any

from harness.collect import collect
from harness.contract.paths import JobPaths, job_dir_name
from harness.report.page import build_report
from harness.spec.plan import point_id as make_point_id

from .kit import FULL, jobdirs


def cpu_rows(t0: float, n: int, watts: float) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        t = t0 + i
        rows.append({"t_wall": t, "t_mono": 5000.0 + i, "kind": "proc", "device": -1, "cpu_pct": 100.0,
                     "mem_pct": 1.0, "rss_mb": 100.0, "nprocs": 2})
        rows.append({"t_wall": t, "t_mono": 5000.0 + i, "kind": "cpu", "device": 0, "energy_j": i * watts})
    return rows


def repeat_run(wd: Path, campaign: str, entity: dict[str, Any], repeat: int, t0: float, tokens: int, ci: float,
               reason: str) -> dict[str, Any]:
    """One repeat of a CPU point: 10 s of training, *tokens* dataset tokens, a precision window of +-*ci*."""
    pid = make_point_id(FULL, entity)
    paths = JobPaths(wd / campaign / job_dir_name(pid, repeat, 1))
    paths.root.mkdir(parents=True)
    jobdirs.write_spec(paths, campaign, pid, repeat, 1, FULL, entity)
    tr0, tr1 = t0 + 3, t0 + 13
    jobdirs.write_stages(paths, "node1", jobdirs.normal_stages("node1", t0, tr0, tr1, [0]))
    jobdirs.write_samples(paths, "node1", cpu_rows(t0, 18, 40.0 + repeat))
    rd = jobdirs.rank_doc(0, "node1", 1, tr0, tr1, dataset_tokens=tokens, dataset_tokens_per_second=tokens / 10)
    rd.update(stopped_by="precision", window="train",
              steady_state={"step_time_cv": 0.1, "ci_rel_halfwidth": ci},
              step_end_wall=[tr0 + k for k in range(1, 11)])
    jobdirs.write_json(paths.rank_result(0), rd)
    res = jobdirs.result_doc("node1", 0, t0, tr1 + 1)
    res["training"] = {"stopped_by": "precision"}
    jobdirs.write_json(paths.result("node1"), res)
    jobdirs.write_json(paths.root / "environment.node1.json", jobdirs.environment_doc("node1", 0, 0))
    jobdirs.write_json(paths.submitted, {"executor": "local", "job_id": f"{campaign}{repeat}"})
    return {"type": "attempt", "campaign": campaign, "point_id": pid, "repeat": repeat, "attempt": 1,
            "job_dir": str(paths.root), "executor": "local", "job_id": f"{campaign}{repeat}",
            "submitted_at": "2025-11-21T23:59:30+00:00", "reason": reason}


def campaign(wd: Path, name: str, tokens: list[int], t0: float) -> dict[str, Any]:
    entity = jobdirs.entity_for(FULL, number_gpus=1, batch_size=4, model_max_length=64)
    pid = make_point_id(FULL, entity)
    lines: list[dict[str, Any]] = [{**jobdirs.manifest_events(name, FULL, "local"),
                                    "repeats": {"min": 2, "max": 3, "cv": 0.02}}]
    lines += [{"type": "point", "campaign": name, "point_id": pid, "repeat": r, "experiment": FULL, "entity": entity,
               "valid": True, "reasons": [], "notes": []} for r in range(len(tokens))]
    for r, tok in enumerate(tokens):
        why = "new" if r < 2 else "more repeats: CV 9.43 % > 2 % with 2 of at most 3 repeats: repeat 2 is next"
        lines.append(repeat_run(wd, name, entity, r, t0 + 30 * r, tok, 0.01 + 0.005 * r, why))
    jobdirs.append_manifest(wd, name, lines)
    return {"point_id": pid, "tokens": tokens}


def section(page: str, sid: str) -> str:
    start = page.index(f'id="{sid}"')
    end = page.find("<section", start + 1)
    return page[start:end if end > 0 else len(page)]


def test_each_point_shows_its_repeats_median_spread_precision_and_energy(tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    c = campaign(wd, "adaptive", [50000, 60000, 56000], jobdirs.T0)
    collect(db, wd, None)
    page = build_report(db).html
    points = section(page, "latest")
    (row,) = re.findall(r'<tr class="ok">(.*?)</tr>', points)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    heads = re.findall(r"<th>(.*?)</th>", points)
    got = dict(zip(heads, cells))
    assert got["repeats"] == "3 (min 2, max 3)" and got["target"] == "CV &lt;= 2 %"
    assert got["state"] == "max reached"  # 3 repeats whose CV is above 2 %: as sbench status says it
    assert got["dataset tok/s (median)"] == "5600" and got["spread (min-max)"] == "5000-6000"
    assert got["precision"] == "+-1.5 %" and got["stopped by"] == "precision"  # the median of 1, 1.5, 2 %
    energy = median([10 * (40.0 + r) for r in range(3)])  # 10 s at 40, 41, 42 W
    per_joule = median(t / (10 * (40.0 + r)) for r, t in enumerate(c["tokens"]))
    assert got["energy J"] == f"{energy:g}" and got["tok/J"] == f"{per_joule:.3g}"
    assert got["# meas."] == "3" and got["stability"].startswith("fair (9.")  # CV 9.1 %
    attempts = section(page, "repeats")
    reasons = re.findall(r"<td>(new|more repeats: [^<]*)</td>", attempts)
    assert reasons == ["new", "new", "more repeats: CV 9.43 % &gt; 2 % with 2 of at most 3 repeats: repeat 2 is next"]


def test_report_compare_builds_its_page_around_both_campaigns(tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    campaign(wd, "nightly-a", [50000, 51000], jobdirs.T0)
    campaign(wd, "nightly-b", [30000, 31000], jobdirs.T0 + 1000)
    campaign(wd, "later", [40000, 40000], jobdirs.T0 + 2000)  # the latest campaign, not compared
    collect(db, wd, None)
    page = build_report(db, compare_to=("nightly-a", "nightly-b")).html
    head = page[:page.index("</div>")]
    assert "Campaigns: <b>nightly-a</b>" in head and "<b>nightly-b</b>" in head and "later" not in head
    assert "<title>sbench report — nightly-a vs nightly-b</title>" in page
    assert "the two campaigns of --compare" in page
    points = section(page, "latest")
    assert "<th>campaign</th>" in points and points.count('<tr class="ok">') == 2
    assert "nightly-a" in points and "nightly-b" in points and "later" not in points
    assert 'id="compare"' in page
    # --campaign still chooses the page's campaign
    page = build_report(db, campaign="later", compare_to=("nightly-a", "nightly-b")).html
    assert "<title>sbench report — later</title>" in page
