"""Commands that answer at once: each login-node command as a fresh process, this tree beside another checkout.

On a results database of a long history (``bench/history.py``'s 100 campaigns x 1,000 runs, samples included)
and a collected campaign of ``--collect-runs`` job dirs, each built by the tree's own code (so trees of different
results schemas are compared, each on a database it reads), it runs each command as a user does, a fresh
interpreter each time (``tests/kit/budget.py``: start-up and imports included, the imports watched), ``--repeat``
times, the trees alternated in every round so that both see the same load. Per command and tree: the median
wall and CPU seconds (user + system, every thread) and the packages of the import budget
(``tests/kit/budget.py``'s ``FORBIDDEN``) it imported.

The goals on a 2-core machine: every read command and a no-op ``collect`` under 1 s; ``--help`` and
``--version`` under 0.3 s.

Usage: .venv/bin/python bench/startup.py [--against ../main] [--dir /tmp/h] [--repeat 5] [--json]
Quick: .venv/bin/python bench/startup.py --campaigns 5 --points 100 --collect-runs 100 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.history import campaign_name  # noqa: E402
from tests.kit.budget import run  # noqa: E402

GOALS_S = {"--help": 0.3, "--version": 0.3}  # every other command: READ_GOAL_S
READ_GOAL_S = 1.0


EXPECTED_EXIT = {"best": (2,), "check": (2,), "profile": (2,)}  # the history has no search, references or profile


def commands(db: Path, collect_db: Path, collect_wd: Path, campaigns: int, empty: Path) -> dict[str, list[str]]:
    mid, last, prev = campaign_name(campaigns // 2), campaign_name(campaigns - 1), campaign_name(campaigns - 2)
    d = ["--db", str(db)]
    run_id = f"{mid}/"  # profile's argument: any run id; these runs were not profiled, so it says so
    return {
        "--version": ["--version"],
        "--help": ["--help"],
        "status --campaign": ["status", "--campaign", mid, "--workdir", str(empty), *d],
        "query": ["query", f"SELECT count(*) AS runs FROM runs WHERE campaign = '{mid}'", *d],
        "best": ["best", last, *d, "--workdir", str(empty)],
        "hosts": ["hosts", *d],
        "compare": ["compare", prev, last, *d],
        "check": ["check", last, "--allow-missing", *d],
        "profile": ["profile", run_id, *d],
        "scaling": ["scaling", last, *d],
        "collect (no-op)": ["collect", "--db", str(collect_db), "--workdir", str(collect_wd), "--json"],
    }


# Each tree's databases are built by that tree's own code (a fresh process with its harness and bench), so that
# trees of different results schemas are each timed on a database they read.
_BUILD = """
import sys
from pathlib import Path
from bench.collect import fake_sacct, generate
from bench.history import build
from harness.collect import collect
from harness.slurm.client import Slurm
db, campaigns, points, cdb, wd, runs = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), \
    Path(sys.argv[5]), int(sys.argv[6])
build(db, campaigns, points)
if not (wd / "done").exists():
    generate(wd, runs, 2, 2, 60)
    (wd / "done").touch()
collect(cdb, wd, slurm=Slurm(fake_sacct))
"""


def prepare(base: Path, tree: str, root: Path, campaigns: int, points: int,
            collect_runs: int) -> tuple[Path, Path, Path]:
    """*tree*'s history database and collected campaign, built by *root*'s code (reused when *base* has them)."""
    base.mkdir(parents=True, exist_ok=True)
    db = base / f"history-{campaigns}x{points}-{tree}.duckdb"
    wd, cdb = base / f"collect-{collect_runs}" / "runs", base / f"collect-{collect_runs}-{tree}.duckdb"
    done = base / f"{db.name}.done"
    if not done.exists():
        print(f"building {db.name} and {cdb.name} with {root} ...", file=sys.stderr)
        for p in (db, cdb, Path(f"{db}.wal"), Path(f"{cdb}.wal")):
            p.unlink(missing_ok=True)
        wd.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", _BUILD, str(db), str(campaigns), str(points), str(cdb), str(wd),
                        str(collect_runs)], cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, check=True,
                       stdout=subprocess.DEVNULL)
        done.touch()
    return db, cdb, wd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", type=Path, default=None, help="Another checkout, timed beside this tree.")
    ap.add_argument("--dir", type=Path, default=None, help="Where to build (and reuse) the databases.")
    ap.add_argument("--campaigns", type=int, default=100)
    ap.add_argument("--points", type=int, default=1000, help="Runs per campaign.")
    ap.add_argument("--collect-runs", type=int, default=1000, help="Job dirs of the no-op collect's campaign.")
    ap.add_argument("--repeat", type=int, default=5, help="Runs of each command per tree (the median is kept).")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    base = a.dir or Path(tempfile.mkdtemp(prefix="sbench-startup-"))
    empty = base / "empty-workdir"
    empty.mkdir(parents=True, exist_ok=True)
    roots = {"this": ROOT}
    if a.against is not None:
        roots = {"before": a.against.resolve(), "this": ROOT}
    cmds_of = {tree: commands(*prepare(base, tree, root, a.campaigns, a.points, a.collect_runs), a.campaigns, empty)
               for tree, root in roots.items()}
    cmds = cmds_of["this"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBENCH_")}
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    loads = []
    missing: set[tuple[str, str]] = set()  # (command, tree): a command that tree does not have
    for _ in range(a.repeat):
        for name in cmds:
            for tree, root in roots.items():
                if (name, tree) in missing:
                    continue
                loads.append(os.getloadavg()[0])
                mine = cmds_of[tree][name]
                w = run(mine, env=env, root=root)
                if w.returncode == 2 and "No such command" in w.stderr:
                    missing.add((name, tree))
                    continue
                # 2: an answer that says what the data lacks (not a search, no references, not profiled); 1 would be
                # a failure (a database this tree cannot read), whose time says nothing
                if w.returncode not in EXPECTED_EXIT.get(name, (0,)) or "Traceback" in w.stderr:
                    raise SystemExit(f"{tree}: sbench {' '.join(mine)}: exit {w.returncode}\n{w.stderr}")
                samples.setdefault((name, tree), []).append((w.wall_s, w.cpu_s))
                seen[(name, tree)] = {"exit": w.returncode, "imported": sorted(w.hits)}
    rows = []
    for name in cmds:
        row: dict[str, Any] = {"command": name, "goal_s": GOALS_S.get(name, READ_GOAL_S)}
        for tree in roots:
            if (name, tree) in missing:
                row[tree] = {"wall_s": None, "cpu_s": None, "exit": None, "imported": []}
                continue
            walls, cpus = zip(*samples[(name, tree)])
            row[tree] = {"wall_s": round(statistics.median(walls), 3), "cpu_s": round(statistics.median(cpus), 3),
                         **seen[(name, tree)]}
        row["meets_goal"] = row["this"]["wall_s"] < row["goal_s"]
        rows.append(row)
    out = {"history_runs": a.campaigns * a.points, "collect_runs": a.collect_runs, "repeat": a.repeat,
           "load_avg_1m": [round(min(loads), 2), round(max(loads), 2)], "roots": {k: str(v) for k, v in roots.items()},
           "rows": rows}
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{a.campaigns * a.points:,}-run history, {a.collect_runs:,}-run no-op collect; median of {a.repeat}; "
          f"load average {out['load_avg_1m'][0]} to {out['load_avg_1m'][1]}")
    trees = list(roots)
    head = f"{'command':<18}" + "".join(f"{t + ' wall / CPU s':>24}" for t in trees) + f"{'goal':>8}  imported"
    print(head)
    print("-" * len(head))
    for r in rows:
        cells = "".join(f"{'(no such command)':>24}" if r[t]["wall_s"] is None else
                        f"{r[t]['wall_s']:>14.2f} / {r[t]['cpu_s']:<7.2f}" for t in trees)
        imported = "; ".join(f"{t}: {', '.join(r[t]['imported']) or '-'}" for t in trees)
        print(f"{r['command']:<18}{cells}{'< ' + format(r['goal_s'], 'g'):>8}  {imported}")
    missed = [r["command"] for r in rows if not r["meets_goal"]]
    print(f"\ngoals: {'every command meets its goal' if not missed else 'MISSED by ' + ', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
