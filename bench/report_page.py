"""The report page of a 1,000-run campaign: its size, and how long headless Chromium takes to open it.

Builds one campaign of POINTS points x REPEATS repeats (two models, LoRA and full, 1 to 8 GPUs, batch sizes 1 and
up; the runs that the modelled GPU memory does not hold run out of it) as job directories in the
job-directory format (``tests/kit/report.py``'s writer, ``tests/kit/jobdirs.py``), collects them for real (a fake
sacct), renders ``sbench report`` and opens the page ROUNDS times in headless Chromium with the network blocked
(``tests/kit/browser.py``, the DevTools protocol): the milliseconds from navigation until every chart is drawn
(``window.sbenchReady``, set once every Vega view has rendered) and the wall seconds of the same, the median kept;
and whether the console logged an error. The page must stay under 2 MB and open in under 2 s.

Usage: .venv/bin/python bench/report_page.py [--points 500] [--repeats 2] [--rounds 5] [--dir DIR] [--reuse]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.kit import FULL, LORA, jobdirs  # noqa: E402
from tests.kit.browser import MAIN_THREAD, open_report, settle  # noqa: E402
from tests.kit.report import DEVICE_MB, collect_into, gpu_memory, write_run  # noqa: E402

MODELS = ("smollm2-135m", "granite-3b-1.5")
GPUS = (1, 2, 4, 8)
BUDGET_BYTES, BUDGET_S = 2 * 2 ** 20, 2.0


def build(base: Path, points: int, repeats: int) -> Path:
    """The campaign's job dirs under *base*/runs, collected into *base*/results.duckdb (returned)."""
    workdir, db = base / "runs", base / "results.duckdb"
    shutil.rmtree(workdir, ignore_errors=True)
    for p in (db, Path(f"{db}.wal")):
        p.unlink(missing_ok=True)
    jobdirs.append_manifest(workdir, "scale", [jobdirs.manifest_events("scale", LORA)])  # the campaign's line
    runs: list[dict[str, Any]] = []
    shapes = itertools.product(range(1, 10 ** 6), MODELS, (LORA, FULL), GPUS)
    for seed, (bs, model, exp, g) in enumerate(itertools.islice(shapes, points)):
        base_mb, per_sample = gpu_memory(model, exp)
        oom = base_mb + per_sample * bs / g > DEVICE_MB
        for r in range(repeats):
            runs.append(write_run(workdir, "scale", exp, model, g, bs, repeat=r, outcome="invalid" if oom else "ok",
                                  seed=seed * repeats + r + 1))
    collect_into(db, workdir, runs)
    return db


def render(db: Path, out: Path) -> float:
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "harness", "report", "--db", str(db), "-o", str(out)],
                         capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit(f"report: exit {res.returncode}\n{res.stdout}\n{res.stderr}")
    return time.perf_counter() - t


def open_times(page: Path, rounds: int) -> dict[str, Any]:
    ready, wall, errors = [], [], []
    main: dict[str, list[float]] = {k: [] for k in MAIN_THREAD}
    for _ in range(rounds):
        with open_report(page, timeout=120) as (browser, check):
            charts = browser.evaluate("Number(document.body.getAttribute('data-charts'))")
            settle(browser, check)
        ready.append(check.ready_ms / 1000)
        wall.append(check.wall_s)
        errors += check.errors
        for k in MAIN_THREAD:
            main[k].append(check.main_thread[k])
    return {"charts": charts, "ready_s": [round(x, 2) for x in ready],
            "ready_median_s": round(statistics.median(ready), 2), "wall_median_s": round(statistics.median(wall), 2),
            "main_thread_median_s": {k: round(statistics.median(v), 3) for k, v in main.items()},
            "console_errors": sorted(set(errors))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="Times the page is opened (the median is kept).")
    ap.add_argument("--dir", type=Path, default=None, help="Where to build (default: a temp dir, removed).")
    ap.add_argument("--reuse", action="store_true", help="Reuse DIR's database if it is there.")
    a = ap.parse_args()
    base = a.dir or Path(tempfile.mkdtemp(prefix="sbench-report-page-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        db = base / "results.duckdb"
        t = time.perf_counter()
        if not (a.reuse and db.exists()):
            build(base, a.points, a.repeats)
        build_s = time.perf_counter() - t
        page = base / "report.html"
        render_s = render(db, page)
        size = page.stat().st_size
        res = {"runs": a.points * a.repeats, "build_s": round(build_s, 1), "render_s": round(render_s, 2),
               "page_mb": round(size / 1e6, 3), "page_mib": round(size / 2 ** 20, 3), **open_times(page, a.rounds)}
        res["within_budget"] = size < BUDGET_BYTES and res["ready_median_s"] < BUDGET_S and not res["console_errors"]
        print(json.dumps(res, indent=1))
        return 0 if res["within_budget"] else 1
    finally:
        if a.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
