"""Scale: a campaign larger than the cluster's limits through real SLURM job arrays on an N-node test cluster.

Starts the project's test cluster with N namespaced nodes (default 8) and ``MaxArraySize`` (default 1001),
sets the user's association limit ``MaxSubmitJobs`` (default 2000), submits a sweep of --tasks points
whose workload is ``runner.workload: idle`` (every task goes through launch.sh, the node runner's
stages and sampler, and writes its result files, but "trains" for one second), waits for the arrays,
with one ``sbench submit`` (the rest fed in waves by sbench's feeder job), waits until the feed has finished
and the queue is empty, collects, and checks that no task was lost or duplicated: every array task
COMPLETED once in sacct, every run ok once in the DB, one result file per job dir. Reports submit time,
arrays and waves, scheduler throughput (tasks per minute from the first start to the last end, from
sacct), collect time and a no-op re-collect, all measured in this one run. Restores the default cluster
(and clears the limit) afterwards unless --keep-cluster.

Usage: .venv/bin/python bench/scale.py [--nodes 8] [--tasks 10000] [--max-array-size 1001]
       [--submit-quota 2000] [--max-parallel N] [--feed-interval 10] [--keep]
Needs root (the cluster script creates network namespaces).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "tests" / "cluster" / "cluster.sh"
SBENCH = [str(Path(sys.executable).parent / "sbench")]


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def cluster(nodes: int, max_array_size: int | None = None) -> None:
    env = {**os.environ, "SBENCH_CLUSTER_NODES": str(nodes)}
    env.pop("SBENCH_CLUSTER_MAX_ARRAY_SIZE", None)
    if max_array_size:
        env["SBENCH_CLUSTER_MAX_ARRAY_SIZE"] = str(max_array_size)
    proc = sh(["bash", str(CLUSTER), "start"], env=env)
    if proc.returncode != 0:
        raise SystemExit(f"cluster start failed:\n{proc.stdout}\n{proc.stderr}")


def submit_quota(n: int) -> None:
    proc = sh(["sacctmgr", "-i", "modify", "user", "where", f"name={getpass.getuser()}", "cluster=sbench", "set",
               f"MaxSubmitJobs={n}"])
    if proc.returncode != 0:
        raise SystemExit(f"sacctmgr failed: {proc.stderr}")
    time.sleep(2)  # the controller takes the new limit from slurmdbd


def sbench(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    proc = sh([*SBENCH, *args], cwd=ROOT)
    return time.perf_counter() - t, proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--max-array-size", type=int, default=1001, help="the cluster's MaxArraySize")
    ap.add_argument("--submit-quota", type=int, default=2000, help="the user's association MaxSubmitJobs")
    ap.add_argument("--max-parallel", type=int, default=None, help="array %%-limit (tasks of a shape at once)")
    ap.add_argument("--feed-interval", type=int, default=10, help="seconds between the feeder job's turns")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    ap.add_argument("--keep-cluster", action="store_true", help="leave the N-node cluster running")
    args = ap.parse_args()
    if shutil.which("bash") is None or os.geteuid() != 0:
        raise SystemExit("needs root and bash (the test cluster uses network namespaces)")
    t = time.perf_counter()
    cluster(args.nodes, args.max_array_size)
    submit_quota(args.submit_quota)
    t_cluster = time.perf_counter() - t
    tmp = Path(tempfile.mkdtemp(prefix="sbench-bench-scale-"))
    hosts = {f"node{i}": {"address": f"198.18.0.{10 + i}"} for i in range(1, args.nodes + 1)}
    inv = tmp / "inv.yaml"
    inv.write_text(yaml.safe_dump({"cluster": "scale", "defaults": {"env": {"OMP_NUM_THREADS": "1"}},
                                   "partitions": {"cpu": {"gpu_model": "cpu", "gpus_per_node": 8, "cpus_per_node": 96,
                                                          "memory_gb": 16, "hosts": hosts}}}))
    (tmp / "model").mkdir()
    campaign = f"scale-{int(time.time())}"
    sweep = tmp / "sweep.yaml"
    repeats = -(-args.tasks // 1000)  # a grid axis holds at most 1,024 values: points x repeats
    per = args.tasks // repeats
    if per * repeats != args.tasks:
        raise SystemExit(f"--tasks must be a multiple of {repeats} (points x repeats)")
    sweep.write_text(yaml.safe_dump({
        "campaign": campaign, "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "tiny", "model_max_length": 64, "number_gpus": 1},
        "grid": {"batch_size": list(range(1, per + 1))}, "repeats": repeats, "model_map": {"tiny": str(tmp / "model")},
        "runner": {"workload": "idle", "idle_seconds": 1.0, "sample_interval_s": 0.5},
        "slurm": {"time": "00:10:00"}}))
    common = ["--workdir", str(tmp / "runs"), "--db", str(tmp / "results.duckdb")]
    os.environ["SBENCH_FEED_INTERVAL"] = str(args.feed_interval)
    t_submit, proc = sbench("submit", str(sweep), "-i", str(inv), "--executor", "slurm", "--no-prepare", "--json",
                            *(["--max-parallel", str(args.max_parallel)] if args.max_parallel else []), *common)
    if proc.returncode != 0:
        raise SystemExit(f"submit failed: {proc.stderr}")
    rep = json.loads(proc.stdout)
    feed_file = tmp / "runs" / campaign / ".slurm" / "feed.json"
    t = time.perf_counter()
    while True:
        doc = json.loads(feed_file.read_text()) if feed_file.exists() else {"finished_at": "no feed"}
        queued = [line for line in sh(["squeue", "-h", "-r", "-o", "%j"]).stdout.splitlines()
                  if line.startswith(f"sbench.{campaign}.")]
        if (doc.get("finished_at") or doc.get("stopped")) and not queued:
            break
        time.sleep(5)
    t_run = time.perf_counter() - t
    waves = doc.get("waves") or []
    acct = sh(["sacct", "-n", "-X", "-P", "-S", "now-1day", "-o", "JobID,State,Start,End,JobName"]).stdout.splitlines()
    tasks = [f for f in (line.split("|") for line in acct if line.strip())
             if f[4].startswith(f"sbench.{campaign}.") and not f[4].endswith(".feed")]
    arrays = sorted({f[0].split("_")[0] for f in tasks})
    ids = [f[0] for f in tasks]
    states = {}
    for f in tasks:
        states[f[1].split()[0]] = states.get(f[1].split()[0], 0) + 1
    import datetime as dt

    starts = [dt.datetime.fromisoformat(f[2]) for f in tasks if f[2] not in ("Unknown", "None")]
    ends = [dt.datetime.fromisoformat(f[3]) for f in tasks if f[3] not in ("Unknown", "None")]
    span = (max(ends) - min(starts)).total_seconds() if starts and ends else None
    t_collect, proc = sbench("collect", "--json", *common)
    if proc.returncode != 0:
        raise SystemExit(f"collect failed: {proc.stderr}")
    col = json.loads(proc.stdout)
    t_noop, proc = sbench("collect", "--json", *common)
    noop = json.loads(proc.stdout)
    import duckdb

    con = duckdb.connect(str(tmp / "results.duckdb"), read_only=True)
    runs, distinct, ok = con.execute("SELECT count(*), count(DISTINCT run_id), count(*) FILTER (WHERE outcome='ok') "
                                     "FROM runs WHERE campaign = ?", [campaign]).fetchone()
    per_node = dict(con.execute("SELECT node_list, count(*) FROM runs WHERE campaign = ? GROUP BY 1 ORDER BY 1",
                                [campaign]).fetchall())
    con.close()
    results = sum(len(list(jd.glob("result.*.json"))) for jd in (tmp / "runs" / campaign).glob("*.a1"))
    out = {
        "nodes": args.nodes, "tasks": args.tasks, "max_parallel": args.max_parallel,
        "cluster_start_s": round(t_cluster, 1),
        "max_array_size": args.max_array_size, "submit_quota": args.submit_quota,
        "submit_s": round(t_submit, 2), "first_wave_sbatch_calls": rep["sbatch_calls"], "submitted": rep["submitted"],
        "held_back_at_submit": rep.get("held_back"), "arrays": len(arrays), "waves": len(waves),
        "feed_stopped": doc.get("stopped"), "queue_drain_s": round(t_run, 1),
        "sacct_tasks": len(tasks), "sacct_distinct_ids": len(set(ids)), "sacct_states": states,
        "scheduler_span_s": span, "tasks_per_minute": round(60 * len(tasks) / span, 1) if span else None,
        "collect_s": round(t_collect, 2), "collect_runs": col["runs"], "collect_new": col["new"],
        "noop_recollect_s": round(t_noop, 2), "noop_new_or_updated": noop["new"] + noop["updated"],
        "db_runs": runs, "db_distinct_runs": distinct, "db_ok": ok, "result_files": results,
        "runs_per_node": per_node,
        "lost_or_duplicated": not (len(tasks) == len(set(ids)) == runs == distinct == ok == results == args.tasks),
    }
    print(json.dumps(out, indent=2))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.keep_cluster:
        submit_quota(-1)
        cluster(2)


if __name__ == "__main__":
    main()
