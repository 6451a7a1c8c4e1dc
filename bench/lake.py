"""A shared store (DuckLake, Postgres catalog) against a DuckDB file, side by side in one run.

Starts the project's test Postgres (``tests/kit/lake.py``: ``start_server``; a fresh catalog database per lake,
``new_lake``) and measures, each command a fresh process with the CLI of this tree (start-up included):

1. collect: ``sbench collect`` of RUNS runs into a fresh lake and into a fresh DuckDB file: wall seconds, the
   ratio lake / file (goal <= 2x), and each collect's phases (its ``--json`` ``timings``);
2. concurrent collectors: the same RUNS runs are four campaigns of RUNS / 4 runs in one work dir; four
   ``sbench collect --campaign C`` processes at once into one fresh lake against the one collector of all of them
   (1.) into another fresh lake: wall ratio (goal <= 1.5x); then the lake of the four is checked to hold RUNS
   runs rows and RUNS distinct run ids;
3. readers on a BIG-run store: ``status --campaign``, ``compare A B --json`` and ``report --campaign`` (best of 3,
   lake and file alternated; goal <= 2 s each on the lake). Both stores are built the same way: one campaign of
   ``--template`` runs (``nightly-001``) is written as job dirs and collected for real, then its rows are copied in
   SQL for the other BIG / template - 1 campaigns in one transaction (``bench/history.py``'s ``multiply``: new run
   ids, campaign names, job dirs, sample file ids, times a day apart);
4. many small collects: SMALL collects of SMALL_RUNS runs, each its own campaign, into a fresh lake; its Parquet
   data files (``sbench db maintain --json``: files_before, files_after; and the files on disk) per 1,000 runs
   before and after ``sbench db maintain``.

The job dirs are ``bench/collect.py``'s generator (every file of docs/job-directory.md) with its fake sacct: the
collect processes run ``sbench collect``'s CLI with ``bench.collect.fake_sacct`` in place of the sacct command.
Shape: HOSTS hosts x GPUS GPUs x TICKS sample ticks a run (default 2 x 2 x 60, bench/history.py's: the fake sacct
answers for 2-node jobs, so a 1-host run is recorded as failed). The campaigns of one work dir
number their runs on from each other (``make_run``'s index), so every run has its own point, job id and sacct time
slot, as one campaign of all of them would (no run shares a host with another at the same time).

Where this tree's collect cannot insert a column of NULLs longer than DuckDB's analysis sample (DuckDB 1.5.5 before
8e975e4: a collect of a few hundred runs failed), the collect processes raise ``pandas_analyze_sample``; the output
says so (``analyze_bug``).

Usage: .venv/bin/python bench/lake.py [--runs 10000] [--big 100000] [--rounds 2] [--dir DIR] [--keep-lakes] [--json]
Quick: .venv/bin/python bench/lake.py --quick        # a small version of everything (a few minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.collect import generate  # noqa: E402
from bench.history import campaign_name, cli, multiply  # noqa: E402
from harness.db.store import open_store  # noqa: E402
from tests.kit import jobdirs  # noqa: E402
from tests.kit.lake import PgServer, start_server  # noqa: E402

# `sbench collect` as a user runs it (harness.cli.main in a fresh interpreter), with bench/collect.py's fake sacct
# answering for SLURM (every job COMPLETED, one batched call per 200 ids). argv: ROOT, ANALYZE_SAMPLE, the CLI's
# arguments; an ANALYZE_SAMPLE other than 0 is set on every connection sbench opens (see analyze_bug).
_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from bench.collect import fake_sacct
from harness.db import store
from harness.slurm import client
if int(sys.argv[2]):
    store.OFFLINE_CONFIG["pandas_analyze_sample"] = int(sys.argv[2])
_init = client.Slurm.__init__
def _fake(self, runner=None, **kw):
    _init(self, runner or fake_sacct, **kw)
client.Slurm.__init__ = _fake
from harness.cli import main
sys.argv = ["sbench", *sys.argv[3:]]
main()
"""
ANALYZE_SAMPLE = 0  # set by main() when this DuckDB has the bug analyze_bug() looks for


def analyze_bug() -> str | None:
    """Whether this tree's ``Store.insert`` fails on 2,000 rows with a column of NULLs only (``stages.error`` of runs
    without errors), as it did with DuckDB 1.5.5 while rows were staged as a dict of numpy object arrays: DuckDB's
    analysis of an object column samples 1,000 values and, finding only NULLs, calls the pandas method
    ``first_valid_index`` on the array, which numpy's arrays lack (fixed in 8e975e4: the rows are staged as a pandas
    frame). Then a collect of a few hundred runs fails; the collect processes here would set
    ``pandas_analyze_sample`` above any column's length, so that every value is analysed and the fallback is never
    reached. The error text when the bug is there, else None."""
    rows = [{"run_id": "r", "host": "h", "rank": i, "stage": "train", "error": None} for i in range(2000)]
    with tempfile.TemporaryDirectory(prefix="sbench-lake-probe-") as d:
        try:
            with open_store(Path(d) / "probe.duckdb") as st, st.transaction():
                st.insert("stages", rows)
            return None
        except Exception as exc:  # noqa: BLE001 - any failure is the bug
            return str(exc).splitlines()[0]


CONCURRENT = 4


def load() -> float:
    return round(os.getloadavg()[0], 2)


@contextlib.contextmanager
def numbered_from(offset: int) -> Iterator[None]:
    """``generate``'s runs numbered from *offset* (``make_run``'s index: the point, the job id, its sacct slot)."""
    real = jobdirs.make_run

    def shifted(workdir: Path, campaign: str, index: int, **kw: Any) -> dict[str, Any]:
        return real(workdir, campaign, index + offset, **kw)

    jobdirs.make_run = shifted
    try:
        yield
    finally:
        jobdirs.make_run = real


def make_workdir(workdir: Path, campaigns: Sequence[tuple[str, int]], shape: dict[str, int]) -> float:
    """Campaigns (name, runs) as job dirs in *workdir*, their runs numbered on from each other (kept when a previous
    call made the same: a marker file); seconds taken."""
    marker = workdir / ".generated.json"
    want = {"campaigns": [list(c) for c in campaigns], **shape}
    if marker.exists() and json.loads(marker.read_text()) == want:
        return 0.0
    shutil.rmtree(workdir, ignore_errors=True)
    t = time.perf_counter()
    offset = 0
    for name, runs in campaigns:
        with numbered_from(offset):
            generate(workdir, runs, shape["hosts"], shape["gpus"], shape["ticks"], campaign=name)
        offset += runs
    marker.write_text(json.dumps(want))
    return round(time.perf_counter() - t, 1)


def collect_argv(workdir: Path, db: str, data: Path | None, campaign: str | None) -> list[str]:
    argv = [sys.executable, "-c", _CHILD, str(ROOT), str(ANALYZE_SAMPLE), "collect", "--workdir", str(workdir),
            "--db", db, "--json"]
    if data is not None:
        argv += ["--db-data", str(data)]
    if campaign is not None:
        argv += ["--campaign", campaign]
    return argv


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SBENCH_DB_DATA")}
    env["SBENCH_DB_WAIT"] = "3600"  # the concurrent collectors wait their turn, however loaded the machine
    env["SBENCH_DEBUG"] = "1"  # a failure's traceback in its log
    return env


class CollectFailed(Exception):
    pass


FAILURES: list[dict[str, str]] = []  # collects that failed and were run again (printed and in the summary)
NOISE: list[dict[str, str]] = []  # collects whose --json output had something else on stdout before it


def retried(what: str, step: Callable[[int], dict[str, Any]], tries: int = 3) -> dict[str, Any]:
    """*step(attempt)*, run again (up to *tries* in all) when a collect of it failed: the failure is kept in
    :data:`FAILURES` and said, never hidden."""
    for attempt in range(tries):
        try:
            return step(attempt)
        except CollectFailed as exc:
            FAILURES.append({"what": what, "attempt": str(attempt + 1), "error": str(exc)})
            print(f"# FAILED ({what}, attempt {attempt + 1}): {exc}", flush=True)
            if attempt + 1 == tries:
                raise SystemExit(f"{what}: {tries} attempts failed") from None
    raise AssertionError("unreachable")


def collects(jobs: Sequence[tuple[Path, str, Path | None, str | None]], logs: Path) -> dict[str, Any]:
    """Run the collects *jobs* (workdir, db, data dir, campaign) at once, each a fresh process: wall seconds until
    the last ends, CPU seconds of them all (user + system), and each one's report (its --json).
    :class:`CollectFailed` when one failed (once every one has ended)."""
    logs.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = load()
    t = time.perf_counter()
    procs = []
    for i, (workdir, db, data, campaign) in enumerate(jobs):
        with (logs / f"collect-{i}.out").open("w") as out, (logs / f"collect-{i}.err").open("w") as err:
            procs.append((subprocess.Popen(collect_argv(workdir, db, data, campaign), stdout=out, stderr=err,
                                           cwd=ROOT, env=child_env()), i))
    ends: dict[int, float] = {}
    while len(ends) < len(procs):
        for p, i in procs:
            if i not in ends and p.poll() is not None:
                ends[i] = time.perf_counter() - t
        time.sleep(0.02)
    wall = max(ends.values())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    failed = [f"collect {i} (exit {p.returncode}): {(logs / f'collect-{i}.err').read_text().strip()[-1500:]}"
              for p, i in procs if p.returncode != 0]
    if failed:
        raise CollectFailed("; ".join(failed))
    reports = []
    for _, i in procs:
        text = (logs / f"collect-{i}.out").read_text()
        # The JSON starts at the first line that is "{": anything before it is something else on stdout (DuckDB's
        # progress bar, drawn while a lake's writer waits its turn), kept to be reported.
        start = 0 if text.startswith("{") else text.index("\n{") + 1
        rep = json.loads(text[start:])
        if start:
            NOISE.append({"collect": f"{logs.name}/collect-{i}", "stdout_before_json": text[:start].strip()[-200:]})
        reports.append({"campaign": rep.get("campaign"), "new": rep["new"], "updated": rep["updated"],
                        "runs": rep["runs"], "sample_rows": rep["sample_rows"], "elapsed_s": rep["elapsed_s"],
                        "ended_s": round(ends[i], 2), "conflicts": rep.get("conflicts"), "timings": rep["timings"],
                        "outcomes": rep["outcomes"], "sacct": rep.get("sacct")})
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_1m": [load0, load()], "reports": reports}


def counts(db: str | Path) -> dict[str, int]:
    with open_store(db, read_only=True) as st:
        runs, distinct = st.con.execute("SELECT count(*), count(DISTINCT run_id) FROM runs").fetchone()
        meas = st.con.execute("SELECT count(*) FROM measurements").fetchone()[0]
        camps = st.con.execute("SELECT count(*) FROM campaigns").fetchone()[0]
        files = st.con.execute("SELECT count(*) FROM sample_files").fetchone()[0]
        ok = st.con.execute("SELECT count(*) FROM runs WHERE outcome = 'ok'").fetchone()[0]
    return {"runs_rows": int(runs), "distinct_runs": int(distinct), "ok": int(ok), "measurements": int(meas),
            "campaigns": int(camps), "sample_files": int(files)}


def parquet_files(data: Path) -> int:
    return sum(1 for _ in data.rglob("*.parquet"))


def size_mb(path: Path) -> float:
    if path.is_file():
        return round(path.stat().st_size / 1e6, 1)
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6, 1)


class Lakes:
    """Fresh lakes on the test Postgres: their --db text, data dir, and catalog database (dropped at the end
    unless kept)."""

    def __init__(self, server: PgServer, base: Path) -> None:
        self.server, self.base, self.made = server, base, []

    def new(self, name: str) -> tuple[str, Path]:
        db, data = self.server.new_lake(self.base / f"{name}-data")
        shutil.rmtree(data, ignore_errors=True)
        self.made.append(db)
        return db, data

    def drop(self) -> None:
        for db in self.made:
            dbname = next(w.split("=", 1)[1] for w in db.split(":", 2)[2].split() if w.startswith("dbname="))
            with contextlib.suppress(subprocess.CalledProcessError):
                self.server.psql(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")


def one_contender(base: Path, lakes: Lakes, workdir: Path, names: Sequence[str], kind: str, r: int, attempt: int,
                  runs: int) -> dict[str, Any]:
    """One timed collect of the work dir into a fresh store: a file, a lake, or a lake by four collectors at once."""
    tag = f"{kind}-{r}" + (f"-again{attempt}" if attempt else "")
    logs = base / "logs" / tag
    if kind == "file":
        db = base / f"collect-{tag}.duckdb"
        for p in (db, Path(str(db) + ".wal")):
            p.unlink(missing_ok=True)
        res = collects([(workdir, str(db), None, None)], logs)
        res["store_mb"] = size_mb(db)
        return res
    db_text, data = lakes.new(tag)
    if kind == "lake":
        res = collects([(workdir, db_text, data, None)], logs)
    else:
        res = collects([(workdir, db_text, data, n) for n in names], logs)
        res["check"] = c = counts(db_text)
        print(f"# concurrent lake: {c['runs_rows']} runs rows, {c['distinct_runs']} distinct run ids, "
              f"{c['ok']} ok, {c['measurements']} measurements, {c['campaigns']} campaigns "
              f"(expected {runs}: {'OK' if c['runs_rows'] == c['distinct_runs'] == runs else 'WRONG'})", flush=True)
    res["store_mb"] = size_mb(data)
    res["parquet_files"] = parquet_files(data)
    return res


# -- 1 and 2: collect ---------------------------------------------------------------------------------------------
def bench_collect(base: Path, lakes: Lakes, runs: int, shape: dict[str, int], rounds: int) -> dict[str, Any]:
    per = runs // CONCURRENT
    names = [f"part-{k + 1}" for k in range(CONCURRENT)]
    workdir = base / f"collect-r{runs}-h{shape['hosts']}-g{shape['gpus']}-t{shape['ticks']}"
    gen_s = make_workdir(workdir, [(n, per) for n in names], shape)
    print(f"# generated {CONCURRENT} campaigns x {per} runs in {gen_s} s; load {load()}", flush=True)
    best: dict[str, dict[str, Any]] = {}
    every: dict[str, list[float]] = {"file": [], "lake": [], "concurrent": []}
    for r in range(rounds):
        order = ["file", "lake", "concurrent"] if r % 2 == 0 else ["concurrent", "lake", "file"]
        for kind in order:
            res = retried(f"{kind} collect, round {r + 1}",
                          lambda attempt, kind=kind, r=r: one_contender(base, lakes, workdir, names, kind, r, attempt,
                                                                         runs))
            every[kind].append(res["wall_s"])
            print(f"# round {r + 1} {kind}: wall {res['wall_s']} s, CPU {res['cpu_s']} s, load {res['load_1m']}",
                  flush=True)
            if kind not in best or res["wall_s"] < best[kind]["wall_s"]:
                best[kind] = res
    if not best["lake"]["reports"][0]["new"] == runs:
        raise SystemExit(f"the lake's collect recorded {best['lake']['reports'][0]['new']} new runs, not {runs}")
    return {"runs": runs, "campaigns": CONCURRENT, "runs_per_campaign": per, "generate_s": gen_s, "rounds": rounds,
            "walls_s": every, **best,
            "ratio_lake_to_file": round(best["lake"]["wall_s"] / best["file"]["wall_s"], 2),
            "ratio_concurrent_to_one": round(best["concurrent"]["wall_s"] / best["lake"]["wall_s"], 2)}


# -- 3: readers on a big store ------------------------------------------------------------------------------------
def bench_readers(base: Path, lakes: Lakes, big: int, template: int, shape: dict[str, int],
                  repeat: int) -> dict[str, Any]:
    if big % template:
        raise SystemExit(f"--big {big} must be a multiple of --template {template}")
    campaigns = big // template
    first = campaign_name(0)
    workdir = base / f"template-r{template}-h{shape['hosts']}-g{shape['gpus']}-t{shape['ticks']}"
    gen_s = make_workdir(workdir, [(first, template)], shape)
    lake_db, lake_data = lakes.new("big")
    file_db = base / "big.duckdb"
    for p in (file_db, Path(str(file_db) + ".wal")):
        p.unlink(missing_ok=True)
    built: dict[str, dict[str, Any]] = {}
    for kind, db, data in (("lake", lake_db, lake_data), ("file", str(file_db), None)):
        res = retried(f"template collect into the {kind}", lambda attempt, kind=kind, db=db, data=data: collects(
            [(workdir, db, data, None)], base / "logs" / f"template-{kind}-{attempt}"))
        t = time.perf_counter()
        multiply(file_db if kind == "file" else db, campaigns, first)  # type: ignore[arg-type]
        mult_s = time.perf_counter() - t
        c = counts(db)
        if c["runs_rows"] != big or c["distinct_runs"] != big:
            raise SystemExit(f"the {kind} store holds {c['runs_rows']} runs ({c['distinct_runs']} distinct), not {big}")
        built[kind] = {"template_collect_s": res["wall_s"], "multiply_s": round(mult_s, 1), "counts": c,
                       "store_mb": size_mb(file_db if kind == "file" else lake_data)}
        if kind == "lake":
            built[kind]["parquet_files"] = parquet_files(lake_data)
        print(f"# {kind} store of {big} runs built: template collect {res['wall_s']} s, SQL copy {mult_s:.1f} s, "
              f"{built[kind]['store_mb']} MB; load {load()}", flush=True)
    empty = base / "empty-workdir"
    empty.mkdir(exist_ok=True)
    mid, prev, last = campaign_name(campaigns // 2), campaign_name(campaigns - 2), campaign_name(campaigns - 1)
    html = base / "report.html"
    commands = {
        f"status --campaign {mid}": (["status", "--campaign", mid, "--workdir", str(empty)], (0,)),
        f"compare {prev} {last} --json": (["compare", prev, last, "--json"], (0, 1)),  # exit 1: a regression found
        f"report --campaign {mid}": (["report", "--campaign", mid, "-o", str(html)], (0,)),
    }
    timings: dict[str, dict[str, Any]] = {}
    loads = [load()]
    for name, (args, codes) in commands.items():
        walls: dict[str, list[float]] = {"lake": [], "file": []}
        cpus: dict[str, list[float]] = {"lake": [], "file": []}
        for r in range(repeat):
            for kind in (("lake", "file") if r % 2 == 0 else ("file", "lake")):
                wall, cpu, res = cli(*args, "--db", lake_db if kind == "lake" else str(file_db))
                if res.returncode not in codes:
                    raise SystemExit(f"{name} on the {kind}: exit {res.returncode}\n{res.stdout[-2000:]}\n"
                                     f"{res.stderr[-2000:]}")
                walls[kind].append(wall)
                cpus[kind].append(cpu)
        loads.append(load())
        timings[name] = {k: {"wall_s": round(min(walls[k]), 2), "cpu_s": round(min(cpus[k]), 2),
                             "walls_s": [round(w, 2) for w in walls[k]]} for k in walls}
        timings[name]["ratio"] = round(timings[name]["lake"]["wall_s"] / timings[name]["file"]["wall_s"], 2)
        print(f"# {name}: lake {timings[name]['lake']['wall_s']} s, file {timings[name]['file']['wall_s']} s; "
              f"load {loads[-1]}", flush=True)
    how = (f"one campaign ({first}) of {template} runs written as job dirs and collected for real (sbench collect) "
           f"into each store, then its rows copied in SQL for {campaigns - 1} more campaigns in one transaction "
           f"(bench/history.py multiply: new run ids, campaign names, job dirs, sample file ids, times a day apart)")
    return {"big": big, "template_runs": template, "campaigns": campaigns, "generate_s": gen_s, "built": built,
            "how": how, "repeat": repeat, "commands": timings, "load_1m": [min(loads), max(loads)]}


# -- 4: many small collects ---------------------------------------------------------------------------------------
def bench_small(base: Path, lakes: Lakes, collects_n: int, runs: int, shape: dict[str, int]) -> dict[str, Any]:
    names = [f"small-{k + 1:02d}" for k in range(collects_n)]
    workdir = base / f"small-{collects_n}x{runs}-h{shape['hosts']}-g{shape['gpus']}-t{shape['ticks']}"
    make_workdir(workdir, [(n, runs) for n in names], shape)
    db, data = lakes.new("small")
    t = time.perf_counter()
    walls = []
    for n in names:
        res = retried(f"small collect {n}", lambda attempt, n=n: collects(
            [(workdir, db, data, n)], base / "logs" / f"small-{n}-{attempt}"))
        walls.append(res["wall_s"])
    collect_s = time.perf_counter() - t
    total = collects_n * runs
    disk_before = parquet_files(data)
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "harness", "db", "maintain", "--db", db, "--json"], capture_output=True,
                         text=True, cwd=ROOT, env=child_env())
    maintain_s = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"db maintain failed:\n{res.stdout}\n{res.stderr}")
    doc = json.loads(res.stdout)
    disk_after = parquet_files(data)
    c = counts(db)
    per = 1000.0 / total
    print(f"# {collects_n} collects of {runs} runs: data files {doc['files_before']} -> {doc['files_after']} "
          f"after maintain ({maintain_s:.1f} s); on disk {disk_before} -> {disk_after}", flush=True)
    return {"collects": collects_n, "runs_each": runs, "runs": total, "collect_walls_s": walls,
            "collects_s": round(collect_s, 1), "maintain_s": round(maintain_s, 2), "maintain": doc,
            "files_per_1000_runs_before": round(doc["files_before"] * per, 1),
            "files_per_1000_runs_after": round(doc["files_after"] * per, 1),
            "disk_files_before": disk_before, "disk_files_after": disk_after,
            "disk_files_per_1000_runs_before": round(disk_before * per, 1),
            "disk_files_per_1000_runs_after": round(disk_after * per, 1), "counts": c}


# -- output -------------------------------------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def table(out: dict[str, Any]) -> str:
    rows = ["| figure | lake | file / one collector | ratio | goal |", "|---|---|---|---|---|"]
    c = out.get("collect")
    if c:
        lk, fl, cc = c["lake"], c["file"], c["concurrent"]
        rows.append(f"| collect of {c['runs']:,} runs, wall s (CPU s) | {lk['wall_s']} ({lk['cpu_s']}) | "
                    f"{fl['wall_s']} ({fl['cpu_s']}) | {c['ratio_lake_to_file']}x | <= 2x: "
                    f"{verdict(c['ratio_lake_to_file'] <= 2)} |")
        rows.append(f"| {CONCURRENT} concurrent collects of {c['runs_per_campaign']:,} runs vs one of {c['runs']:,}, "
                    f"wall s (CPU s) | {cc['wall_s']} ({cc['cpu_s']}) | {lk['wall_s']} ({lk['cpu_s']}) | "
                    f"{c['ratio_concurrent_to_one']}x | <= 1.5x: {verdict(c['ratio_concurrent_to_one'] <= 1.5)} |")
        k = cc["check"]
        rows.append(f"| concurrent lake: runs rows / distinct run ids | {k['runs_rows']:,} / {k['distinct_runs']:,} | "
                    f"expected {c['runs']:,} | | "
                    f"{verdict(k['runs_rows'] == k['distinct_runs'] == c['runs'])} |")
    rd = out.get("readers")
    if rd:
        for name, t in rd["commands"].items():
            rows.append(f"| `{name}` on {rd['big']:,} runs, best of {rd['repeat']}, wall s (CPU s) | "
                        f"{t['lake']['wall_s']} ({t['lake']['cpu_s']}) | "
                        f"{t['file']['wall_s']} ({t['file']['cpu_s']}) | "
                        f"{t['ratio']}x | <= 2 s: {verdict(t['lake']['wall_s'] <= 2)} |")
    s = out.get("small")
    if s:
        rows.append(f"| data files per 1,000 runs after {s['collects']} collects of {s['runs_each']} runs: "
                    f"before / after `db maintain` | {s['files_per_1000_runs_before']} / "
                    f"{s['files_per_1000_runs_after']} (on disk {s['disk_files_per_1000_runs_before']} / "
                    f"{s['disk_files_per_1000_runs_after']}) | | | |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10_000, help="Runs of the collect figures (a multiple of 4).")
    ap.add_argument("--big", type=int, default=100_000, help="Runs of the readers' store.")
    ap.add_argument("--template", type=int, default=2_000, help="Runs collected for real into the readers' store.")
    ap.add_argument("--small", type=int, default=20, help="How many small collects (each its own campaign).")
    ap.add_argument("--small-runs", type=int, default=50, help="Runs of each small collect.")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--ticks", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=1, help="Rounds of the collect figures, alternated (best kept).")
    ap.add_argument("--repeat", type=int, default=3, help="Runs of each read command per store (best kept).")
    ap.add_argument("--skip", action="append", default=[], choices=["collect", "readers", "small"])
    ap.add_argument("--dir", type=Path, default=None,
                    help="Keep the work dirs, file stores and logs here (work dirs already generated are reused).")
    ap.add_argument("--keep-lakes", action="store_true",
                    help="Keep the lakes made (catalog databases, data dirs); else they are dropped at the end.")
    ap.add_argument("--quick", action="store_true", help="A small version of everything (to try the script).")
    ap.add_argument("--json", action="store_true", help="Print only the JSON summary.")
    a = ap.parse_args()
    if a.quick:
        a.runs, a.big, a.template, a.small, a.small_runs, a.repeat = 400, 4_000, 400, 5, 20, 2
    if a.runs % CONCURRENT:
        raise SystemExit(f"--runs {a.runs}: a multiple of {CONCURRENT}")
    shape = {"hosts": a.hosts, "gpus": a.gpus, "ticks": a.ticks}
    base = (a.dir or Path(tempfile.mkdtemp(prefix="sbench-lake-"))).resolve()
    base.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"shape": shape, "load_1m_start": list(map(lambda x: round(x, 2), os.getloadavg())),
                           "cores": os.cpu_count()}
    print(f"# load average at start (1, 5, 15 min): {out['load_1m_start']}; {os.cpu_count()} cores; dir {base}",
          flush=True)
    global ANALYZE_SAMPLE
    bug = analyze_bug()
    if bug is not None:
        ANALYZE_SAMPLE = 1_000_000_000
        out["duckdb_analyze_workaround"] = bug
        print(f"# this tree's Store.insert fails on 2,000 NULLs ({bug}): every collect here runs "
              f"with pandas_analyze_sample = {ANALYZE_SAMPLE:,} (see analyze_bug)", flush=True)
    server = start_server()
    os.environ.update(server.env)
    os.environ.pop("SBENCH_DB_DATA", None)
    lakes = Lakes(server, base / "lakes")
    try:
        if "collect" not in a.skip:
            out["collect"] = bench_collect(base, lakes, a.runs, shape, a.rounds)
        if "readers" not in a.skip:
            out["readers"] = bench_readers(base, lakes, a.big, a.template, shape, a.repeat)
        if "small" not in a.skip:
            out["small"] = bench_small(base, lakes, a.small, a.small_runs, shape)
    finally:
        if not a.keep_lakes:
            lakes.drop()
            shutil.rmtree(base / "lakes", ignore_errors=True)
        if a.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    out["failures"] = FAILURES
    out["stdout_noise"] = NOISE
    out["load_1m_end"] = list(map(lambda x: round(x, 2), os.getloadavg()))
    out["total_s"] = round(time.perf_counter() - t0, 1)
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"\nShape: {a.hosts} host(s) x {a.gpus} GPU(s) x {a.ticks} ticks a run; load average at start "
          f"{out['load_1m_start']}, at end {out['load_1m_end']}; {out['total_s']} s in all.")
    if "readers" in out:
        print(f"Readers' stores: {out['readers']['how']}.")
    for f in FAILURES:
        print(f"FAILED and run again: {f['what']} (attempt {f['attempt']}): {f['error']}")
    for n in NOISE:
        print(f"collect --json wrote something else on stdout before its JSON ({n['collect']}): "
              f"{n['stdout_before_json']!r}")
    print()
    print(table(out))
    print("\n```json")
    print(json.dumps(out, indent=2))
    print("```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
