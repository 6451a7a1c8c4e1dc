"""Results at the scale of a real history: status, report, compare and query on a 100,000-run database.

``build(db, campaigns, points, ...)`` makes a results database shaped exactly as ``sbench collect`` writes
it: one campaign of *points* runs is written as job directories (``tests/kit/jobdirs.py``, the files of
docs/job-directory.md, samples included) and collected for real; the database's rows are then repeated
for the other campaigns with SQL (``INSERT ... SELECT``), each copy with its own campaign, run ids, job
dirs, sample file ids, and times one day later than the one before, its throughput scaled by a fixed
factor per campaign. So a nightly history: every campaign measures the same points, with their samples.

The bench then times, as a user runs them (a fresh ``python -m harness`` process each, start-up
included), ``status --campaign``, ``report`` (the latest campaign, and ``--campaign``), ``compare`` of two
campaigns and a ``query``; and ``collect`` of a campaign of *collect_runs* job dirs (``bench/collect.py``'s
generator, a fake sacct) with its no-op re-collect (a fresh ``sbench collect`` process). Best of
``--repeat`` rounds each.

Usage: .venv/bin/python bench/history.py [--campaigns 100] [--points 1000] [--collect-runs 10000] [--dir DIR]
Quick: .venv/bin/python bench/history.py --campaigns 10 --points 200 --collect-runs 500
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.collect import fake_sacct, generate  # noqa: E402
from harness.collect import collect  # noqa: E402
from harness.db.schema import SCHEMA, q  # noqa: E402
from harness.db.store import open_store  # noqa: E402
from harness.slurm.client import Slurm  # noqa: E402

PREFIX = "nightly-"
DAY_S = 86400.0
# Columns that carry the campaign's name (run ids are ``<campaign>/<job dir>``; paths hold the campaign dir).
_NAMED = ("run_id", "campaign", "job_dir", "path")
# Wall-clock seconds (moved with the copy's day); t_mono is a monotonic clock and stays.
_WALL = ("t_wall", "t0")
# Throughput columns scaled per campaign, so that compare has something to say.
_SCALED = ("dataset_tokens_per_second", "train_tokens_per_second", "train_tokens_per_second_exact",
           "train_samples_per_second", "train_tokens_per_gpu_per_second", "dataset_tokens_per_second_per_gpu")


def campaign_name(i: int) -> str:
    return f"{PREFIX}{i + 1:03d}"


def factor(k: int) -> float:
    """The throughput factor of campaign *k* (0: the collected campaign, 1.0): within +-5 %, fixed."""
    return 1.0 if k == 0 else 1.0 + 0.01 * ((k * 7) % 11 - 5)


def _copy_expr(table: str, col: str, typ: str, template: str) -> str | None:
    """The SQL of copy ``k.k``'s value of *table*.*col* (``camp`` is its campaign's name), or None: unchanged."""
    c = q(col)
    if col in _NAMED and typ == "VARCHAR":
        return f"replace({c}, '{template}', camp)"
    if col == "overlapped_with":
        return f"list_transform({c}, lambda x: replace(x, '{template}', camp))"
    if col == "file_id":
        return f"{c} + k * (SELECT max(file_id) + 1 FROM sample_files)"
    if typ == "TIMESTAMP":
        return f"{c} + to_days(CAST(k AS INTEGER))"
    if typ == "DOUBLE" and (col.endswith("_wall") or col in _WALL):
        return f"{c} + k * {DAY_S}"
    if table == "measurements" and col in _SCALED:
        return f"{c} * (1.0 + 0.01 * ((k * 7) % 11 - 5))"
    return None


def multiply(db: Path, campaigns: int, template: str) -> None:
    """Repeat every row of *template*'s campaign for campaigns 2..*campaigns* (one transaction)."""
    copies = f"(SELECT k, '{PREFIX}' || lpad(CAST(k + 1 AS VARCHAR), 3, '0') AS camp FROM range(1, {campaigns}) r(k))"
    with open_store(db) as st:
        tables = {r[0] for r in st.con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        with st.transaction():
            # sample_rows before sample_files: its file ids are offset by the template's max file_id.
            order = ["sample_rows", *[t for t in SCHEMA if t != "sample_rows"]]
            for table in order:
                cols = SCHEMA[table]
                names = {c for c, _ in cols}
                if table not in tables or table in ("metadata", "points", "probes", "fabric"):
                    continue
                if not ({"run_id", "campaign", "file_id"} & names):
                    continue
                repl = [(c, e) for c, t in cols if (e := _copy_expr(table, c, t, template)) is not None]
                select = "t.*" + (f" REPLACE ({', '.join(f'{e} AS {q(c)}' for c, e in repl)})" if repl else "")
                st.con.execute(f"INSERT INTO {q(table)} SELECT {select} FROM {q(table)} t, {copies} c")


def build(db: Path, campaigns: int = 100, points: int = 1000, hosts: int = 2, gpus: int = 2,
          ticks: int = 60) -> dict[str, Any]:
    """A results DB of *campaigns* x *points* runs with their samples (see the module docstring); returns
    its counts and the seconds each step took."""
    for p in (db, Path(str(db) + ".wal")):
        if p.exists():
            p.unlink()
    workdir = db.parent / f"{db.stem}-template"
    shutil.rmtree(workdir, ignore_errors=True)
    template = campaign_name(0)
    t = time.perf_counter()
    generate(workdir, points, hosts, gpus, ticks, campaign=template)
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    collect(db, workdir, slurm=Slurm(fake_sacct))
    collect_s = time.perf_counter() - t
    shutil.rmtree(workdir, ignore_errors=True)
    t = time.perf_counter()
    multiply(db, campaigns, template)
    multiply_s = time.perf_counter() - t
    with open_store(db, read_only=True) as st:
        counts = {tb: int(st.con.execute(f"SELECT count(*) FROM {q(tb)}").fetchall()[0][0])
                  for tb in ("campaigns", "runs", "measurements", "sample_files", "sample_rows", "stages")}
    return {"counts": counts, "template_generate_s": round(gen_s, 1), "template_collect_s": round(collect_s, 1),
            "multiply_s": round(multiply_s, 1), "db_mb": round(db.stat().st_size / 1e6)}


def cli(*args: str, root: Path = ROOT) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall and CPU (user + system, every thread) seconds of one ``python -m harness ARGS`` process (start-up
    included), and its result. On a shared machine the CPU seconds are the steadier figure. *root*: the
    checkout whose ``harness`` runs (another one's, to compare before and after)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=root, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), res


def time_commands(db: Path, campaigns: int, repeat: int = 3, root: Path = ROOT) -> dict[str, dict[str, float]]:
    """Best wall and CPU seconds of each read command on *db* (each must succeed), run by *root*'s harness."""
    empty = db.parent / "empty-workdir"
    empty.mkdir(exist_ok=True)
    mid, last, prev = campaign_name(campaigns // 2), campaign_name(campaigns - 1), campaign_name(campaigns - 2)
    html = db.parent / "report.html"
    common = ["--db", str(db)]
    commands = {
        "status --campaign": ["status", "--campaign", mid, "--workdir", str(empty), *common],
        "report (latest)": ["report", "-o", str(html), *common],
        "report --campaign": ["report", "--campaign", mid, "-o", str(html), *common],
        "compare": ["compare", prev, last, *common],
        "query": ["query", f"SELECT count(*) AS runs FROM runs WHERE campaign = '{mid}'", *common],
    }
    out: dict[str, dict[str, float]] = {}
    for name, args in commands.items():
        walls, cpus = [], []
        for _ in range(repeat):
            wall, cpu, res = cli(*args, root=root)
            if res.returncode != 0:
                raise SystemExit(f"{name}: exit {res.returncode}\n{res.stdout}\n{res.stderr}")
            walls.append(wall)
            cpus.append(cpu)
        out[name] = {"wall_s": round(min(walls), 2), "cpu_s": round(min(cpus), 2)}
    return out


def time_collect(base: Path, runs: int, hosts: int, gpus: int, ticks: int) -> dict[str, Any]:
    """A campaign of *runs* job dirs: a full collect (in-process, fake sacct) and a no-op re-collect as a
    user runs it (a fresh process; every run is finished, so it asks no scheduler)."""
    workdir, db = base / "collect-runs", base / "collect.duckdb"
    shutil.rmtree(workdir, ignore_errors=True)
    for p in (db, Path(str(db) + ".wal")):
        if p.exists():
            p.unlink()
    t = time.perf_counter()
    generate(workdir, runs, hosts, gpus, ticks)
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    rep = collect(db, workdir, slurm=Slurm(fake_sacct))
    collect_s = time.perf_counter() - t
    noop_s, noop_cpu, res = cli("collect", "--db", str(db), "--workdir", str(workdir), "--json")
    changed = json.loads(res.stdout) if res.returncode == 0 else {}
    return {"runs": runs, "generate_s": round(gen_s, 1), "collect_s": round(collect_s, 2),
            "sample_rows": rep.sample_rows, "phases_s": rep.timings, "noop_cli_s": round(noop_s, 2),
            "noop_cli_cpu_s": round(noop_cpu, 2),
            "noop_changed": changed.get("new", -1) + changed.get("updated", -1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--campaigns", type=int, default=100)
    ap.add_argument("--points", type=int, default=1000, help="Runs per campaign (each a point).")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=2, help="GPUs per host (sample rows per tick: gpus + 1 per host).")
    ap.add_argument("--ticks", type=int, default=60, help="Sample ticks per run and host.")
    ap.add_argument("--collect-runs", type=int, default=10_000, help="Runs of the collect timing (0: skip it).")
    ap.add_argument("--repeat", type=int, default=3, help="Timed rounds of each command (best kept).")
    ap.add_argument("--dir", type=Path, default=None, help="Where to build (default: a temp dir, removed).")
    ap.add_argument("--reuse", action="store_true", help="Reuse DIR's database if it is there.")
    ap.add_argument("--against", type=Path, default=None,
                    help="Another checkout (e.g. the main branch's) whose read commands are timed beside this one's.")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    base = a.dir or Path(tempfile.mkdtemp(prefix="sbench-history-"))
    base.mkdir(parents=True, exist_ok=True)
    db = base / "history.duckdb"
    out: dict[str, Any] = {"campaigns": a.campaigns, "runs_per_campaign": a.points}
    if not (a.reuse and db.exists()):
        out["build"] = build(db, a.campaigns, a.points, a.hosts, a.gpus, a.ticks)
    out["commands_s"] = time_commands(db, a.campaigns, a.repeat)
    if a.against is not None:
        out["against"] = str(a.against.resolve())
        out["against_commands_s"] = time_commands(db, a.campaigns, a.repeat, root=a.against.resolve())
    if a.collect_runs:
        out["collect"] = time_collect(base, a.collect_runs, a.hosts, a.gpus, a.ticks)
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:>18}: {v}")
        worst = max(v["wall_s"] for v in out["commands_s"].values())
        print(f"\ntargets: every read command < 2 s: {'PASS' if worst < 2 else 'FAIL'} (slowest {worst} s)", end="")
        if a.collect_runs:
            c = out["collect"]
            print(f"; collect < 60 s: {'PASS' if c['collect_s'] < 60 else 'FAIL'}; "
                  f"no-op re-collect < 2 s: {'PASS' if c['noop_cli_s'] < 2 else 'FAIL'}", end="")
        print()
    if a.dir is None:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
