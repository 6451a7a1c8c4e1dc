"""Commands that answer at once: each login-node command as a fresh process, this tree beside another checkout.

On a results database of a long history (``bench/history.py``'s 100 campaigns x 1,000 runs, samples included)
and a collected campaign of ``--collect-runs`` job dirs, it runs each command as a user does, a fresh
interpreter each time (``tests/budget.py``: start-up and imports included, the imports watched), ``--repeat``
times, the trees alternated in every round so that both see the same load. Per command and tree: the median
wall and CPU seconds (user + system, every thread) and the packages of the import budget
(``tests/budget.py``'s ``FORBIDDEN``) it imported.

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
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.collect import fake_sacct, generate  # noqa: E402
from bench.history import build, campaign_name  # noqa: E402
from harness.collect import collect  # noqa: E402
from harness.slurm.client import Slurm  # noqa: E402
from tests.budget import run  # noqa: E402

GOALS_S = {"--help": 0.3, "--version": 0.3}  # every other command: READ_GOAL_S
READ_GOAL_S = 1.0


def commands(db: Path, campaigns: int, collect_db: Path, collect_wd: Path, empty: Path) -> dict[str, list[str]]:
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


def prepare(base: Path, campaigns: int, points: int, collect_runs: int) -> tuple[Path, Path, Path]:
    """The history database and a collected campaign (reused when *base* has them)."""
    base.mkdir(parents=True, exist_ok=True)
    db = base / f"history-{campaigns}x{points}.duckdb"
    if not (base / f"{db.name}.done").exists():
        print(f"building {db} ({campaigns} x {points} runs) ...", file=sys.stderr)
        build(db, campaigns, points)
        (base / f"{db.name}.done").touch()
    wd, cdb = base / f"collect-{collect_runs}" / "runs", base / f"collect-{collect_runs}" / "results.duckdb"
    if not (base / f"collect-{collect_runs}.done").exists():
        print(f"generating and collecting {collect_runs} job dirs ...", file=sys.stderr)
        generate(wd, collect_runs, 2, 2, 60)
        collect(cdb, wd, slurm=Slurm(fake_sacct))
        (base / f"collect-{collect_runs}.done").touch()
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
    db, cdb, wd = prepare(base, a.campaigns, a.points, a.collect_runs)
    empty = base / "empty-workdir"
    empty.mkdir(exist_ok=True)
    roots = {"this": ROOT}
    if a.against is not None:
        roots = {"before": a.against.resolve(), "this": ROOT}
    cmds = commands(db, a.campaigns, cdb, wd, empty)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBENCH_")}
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    loads = []
    for _ in range(a.repeat):
        for name, argv in cmds.items():
            for tree, root in roots.items():
                loads.append(os.getloadavg()[0])
                w = run(argv, env=env, root=root)
                if w.returncode not in (0, 1, 2) or "Traceback" in w.stderr:
                    raise SystemExit(f"{tree}: sbench {' '.join(argv)}: exit {w.returncode}\n{w.stderr}")
                samples.setdefault((name, tree), []).append((w.wall_s, w.cpu_s))
                seen[(name, tree)] = {"exit": w.returncode, "imported": sorted(w.hits)}
    rows = []
    for name in cmds:
        row: dict[str, Any] = {"command": name, "goal_s": GOALS_S.get(name, READ_GOAL_S)}
        for tree in roots:
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
        cells = "".join(f"{r[t]['wall_s']:>14.2f} / {r[t]['cpu_s']:<7.2f}" for t in trees)
        imported = "; ".join(f"{t}: {', '.join(r[t]['imported']) or '-'}" for t in trees)
        print(f"{r['command']:<18}{cells}{'< ' + format(r['goal_s'], 'g'):>8}  {imported}")
    missed = [r["command"] for r in rows if not r["meets_goal"]]
    print(f"\ngoals: {'every command meets its goal' if not missed else 'MISSED by ' + ', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
