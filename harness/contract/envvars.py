"""Every ``SBENCH_*`` environment variable sbench reads or sets: its name, what it means and its default.

Code reads a variable through its entry here (``envvars.DATA_DIR.get()``) and sets one by its name
(``{envvars.HOST.name: host}``), so the table below is the whole list; tests/test_contract.py checks that
no other ``SBENCH_*`` name appears in the package. An empty value counts as unset.

Three kinds:

- login node: what the CLI and the library read (inventory, DB, work dir, data, environments);
- job: what render (``env/<host>.sh``), ``launch.sh`` and the node runner set for the processes of a job,
  and the runner reads; those marked ``recorded`` are written to ``environment.<host>.json`` and
  ``rank.<rank>.json`` (:mod:`harness.runner.envcapture`);
- tests: switches that let the tests fake hardware, inject failures or stop at a chosen point.

The shell templates read three of them themselves (``launch.sh``: ``SBENCH_HOST``, ``SBENCH_MAIN_PORT``,
``SBENCH_HOST_ADDRESS``). The test suite's own (``SBENCH_SKIP_SLURM``, ``SBENCH_CLUSTER_*``) are read only
by tests/ and tests/cluster/cluster.sh.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Var:
    name: str
    default: str  # what an unset variable means to sbench's Python code; "" = nothing
    meaning: str
    kind: str  # login | job | tests
    recorded: bool = False  # written to environment.<host>.json and rank.<rank>.json

    def get(self, environ: Mapping[str, str] | None = None) -> str:
        """The variable's value in *environ* (default: this process's environment), else its default."""
        return (os.environ if environ is None else environ).get(self.name) or self.default


# -- login node ---------------------------------------------------------------------------------------------
INVENTORY = Var("SBENCH_INVENTORY", "", "Inventory YAML when -i is not given; unset: the built-in local inventory",
                "login")
MODEL_MAP = Var("SBENCH_MODEL_MAP", "", "YAML of model name -> HF id or local path, over the built-in map", "login")
DB = Var("SBENCH_DB", "results/results.duckdb", "The results database when --db is not given", "login")
WORKDIR = Var("SBENCH_WORKDIR", "results/runs", "Where job directories live when --workdir is not given", "login")
DATA_DIR = Var("SBENCH_DATA_DIR", "results/datasets",
               "Datasets and prepared data, when neither the sweep's data_dir nor the inventory's defaults.data_dir "
               "names them", "login", recorded=True)
ENVS_DIR = Var("SBENCH_ENVS_DIR", "",
               "Trainer environments, when the inventory's defaults.envs_dir does not name them; unset: "
               "$XDG_CACHE_HOME/sbench/envs, else ~/.cache/sbench/envs", "login")
DEBUG = Var("SBENCH_DEBUG", "", "Any value: the CLI shows the traceback of an internal error", "login")
DB_DATA = Var("SBENCH_DB_DATA", "",
              "A shared store's data directory (its Parquet files: NFS, Lustre) when --db-data is not given", "login")
DB_WAIT = Var("SBENCH_DB_WAIT", "",
              "Seconds to wait for another sbench process's write lock on the results database; unset: 5 for a "
              "DuckDB file, 600 for a shared store (where writers take turns)", "login")
CAMPAIGN_WAIT = Var("SBENCH_CAMPAIGN_WAIT", "5",
                    "Seconds a submit, retry or cancel waits for another's lock on the same campaign, then exits 1 "
                    "naming the holder", "login")
FEED_INTERVAL = Var("SBENCH_FEED_INTERVAL", "60",
                    "Seconds between two turns of a campaign's feeder job, which submits what the submit quota held "
                    "back (read at submit; the feeder keeps it)", "login")

# -- job: set by render (env/<host>.sh) --------------------------------------------------------------------
CAMPAIGN = Var("SBENCH_CAMPAIGN", "", "The attempt's campaign", "job", recorded=True)
POINT_ID = Var("SBENCH_POINT_ID", "", "The attempt's point id", "job", recorded=True)
REPEAT = Var("SBENCH_REPEAT", "", "The attempt's repeat", "job", recorded=True)
ATTEMPT = Var("SBENCH_ATTEMPT", "", "The attempt's number", "job", recorded=True)
PARTITION = Var("SBENCH_PARTITION", "", "The attempt's inventory partition", "job", recorded=True)
HOST_ADDRESS = Var("SBENCH_HOST_ADDRESS", "",
                   "The host's inventory address; launch.sh binds gloo and NCCL to the interface holding it", "job",
                   recorded=True)

# -- job: set by launch.sh and the node runner (the local executor sets SBENCH_HOST and SBENCH_MAIN_PORT) ------
HOST = Var("SBENCH_HOST", "", "This node's name; see host()", "job", recorded=True)
MACHINE_RANK = Var("SBENCH_MACHINE_RANK", "", "This node's rank in the job; unset: $SLURM_NODEID, else 0", "job",
                   recorded=True)
MAIN_IP = Var("SBENCH_MAIN_IP", "", "The rendezvous address (node 0's)", "job", recorded=True)
MAIN_PORT = Var("SBENCH_MAIN_PORT", "29500",
                "The rendezvous port; unset, launch.sh derives one from the SLURM job id, and the node runner's "
                "trials count from torch's default", "job", recorded=True)
TRIAL = Var("SBENCH_TRIAL", "", "The stability trial a training process belongs to (the node runner sets it)", "job",
            recorded=True)
PACK = Var("SBENCH_PACK", "",
           "The job dirs of a pack (slurm.pack), as a JSON list, the first being the one launched: the node runner "
           "and the sbench trainer's processes run each point in turn, in one training process "
           "(harness.campaign.executors.pack)", "job")
LAUNCHED_WALL = Var("SBENCH_LAUNCHED_WALL", "",
                    "When the node runner started the training command (wall clock): where each rank's launch "
                    "stage begins; unset: when the rank's process started", "job")
PROFILE_TOOL = Var("SBENCH_PROFILE_TOOL", "torch",
                   "Set by the node runner for a profiled job: the profiler the trainer drives (nsys when the job runs "
                   "under Nsight Systems, else torch)", "job")
LOCAL_TOKEN = Var("SBENCH_LOCAL_TOKEN", "",
                  "Set by the local executor on each launch and on its queue process: a keyed digest of the job dir "
                  "(or queue file) under this user's key; status and cancel trust a process only when its "
                  "/proc/<pid>/environ carries the value they compute themselves (harness.slurm.localjob)", "job")

# -- tests (each also works by hand) -------------------------------------------------------------------------
SAMPLER_BACKEND = Var("SBENCH_SAMPLER_BACKEND", "nvml", "The sampler's GPU backend: nvml, fake or none", "tests",
                      recorded=True)
FAKE_GPUS = Var("SBENCH_FAKE_GPUS", "2", "GPUs the fake sampler backend pretends to see", "tests", recorded=True)
FAULT = Var("SBENCH_FAULT", "", "Failures to inject into the trainers (syntax: harness.runner.faults)", "tests",
            recorded=True)
STAGE_LOG = Var("SBENCH_STAGE_LOG", "1", "0 turns the ranks' stage events off (bench/overhead.py measures them)",
                "tests", recorded=True)
SYSFS_IB = Var("SBENCH_SYSFS_IB", "/sys/class/infiniband", "Where environment capture and probe read the HCAs",
               "tests")
POWERCAP = Var("SBENCH_POWERCAP", "/sys/class/powercap",
               "Where the sampler reads the RAPL energy counters (intel-rapl:<n>/energy_uj) on CPU partitions",
               "tests")
PROC_STAT = Var("SBENCH_PROC_STAT", "/proc/stat",
                "Where the sampler reads the host's CPU time (its cpu line) for the host's other load", "tests")
HOST_BUSY_CPU = Var("SBENCH_HOST_BUSY_CPU", "0.25",
                    "runner.host_busy_cpu when the sweep does not set it: the share of a host's CPU capacity that "
                    "other work may use during a run's window before the run is flagged host_busy (1 = never)",
                    "login")
STRAGGLER_SCORE = Var("SBENCH_STRAGGLER_SCORE", "0.7",
                       "runner.straggler_score when the sweep does not set it: a rank whose relative or individual "
                       "score is below it is flagged a straggler (rank_scores, measurements.straggler)", "login")
PREFLIGHT_THRESHOLD = Var("SBENCH_PREFLIGHT_THRESHOLD", "",
                           "sbench preflight's and submit --preflight's threshold when --threshold is not given: a "
                           "device under this share of its partition's median is slow; unset: "
                           "harness.contract.defaults.PREFLIGHT_THRESHOLD (0.9)", "login")
COLLECT_PAUSE_AT = Var("SBENCH_COLLECT_PAUSE_AT", "",
                       "A collect phase to pause at, inside its transaction, so that a test can kill it there",
                       "tests")
COLLECT_PAUSE_S = Var("SBENCH_COLLECT_PAUSE_S", "60", "How long collect pauses at SBENCH_COLLECT_PAUSE_AT", "tests")

VARS: tuple[Var, ...] = tuple(v for v in globals().values() if isinstance(v, Var))
RECORDED: frozenset[str] = frozenset(v.name for v in VARS if v.recorded)
# Recorded variables that name the attempt, not how it ran: sbench's job variables, and what SLURM and the
# launchers set for each job and process. Two runs of the same settings differ in these (compare leaves them out
# of what changed between two campaigns' environments).
PER_ATTEMPT: frozenset[str] = frozenset(v.name for v in VARS if v.kind == "job") | frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "NODE_RANK", "CUDA_VISIBLE_DEVICES"})
PER_ATTEMPT_PREFIXES = ("SLURM_", "SLURMD_", "TORCHELASTIC_")


def host(environ: Mapping[str, str] | None = None) -> str:
    """This node's name, by launch.sh's rule: ``$SLURMD_NODENAME`` (the SLURM node name: namespaced test nodes
    share one hostname), else ``$SBENCH_HOST``, else the short hostname. launch.sh exports the result as
    ``SBENCH_HOST``, so every process of a job agrees."""
    e = os.environ if environ is None else environ
    return e.get("SLURMD_NODENAME") or HOST.get(e) or socket.gethostname().split(".")[0]
