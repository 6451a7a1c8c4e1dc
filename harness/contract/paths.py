"""Where sbench's files are: one class owns the layout of a job directory (the runner and collect both
use it); beside it the login node's default DB and work dir, and a dataset's file name in the data dir."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from . import envvars

_SAFE = re.compile(r"[^A-Za-z0-9._-]")

# Login-node defaults (the CLI's --db / --workdir, or $SBENCH_DB / $SBENCH_WORKDIR, override them).
DEFAULT_DB = Path(envvars.DB.default)
DEFAULT_WORKDIR = Path(envvars.WORKDIR.default)


def resolve_workdir(workdir: str | Path | None = None) -> Path:
    """The work dir: *workdir*, else $SBENCH_WORKDIR, else results/runs; absolute."""
    return Path(workdir or envvars.WORKDIR.get()).resolve()


def resolve_db(db: str | Path | None = None) -> Path:
    """The results database: *db*, else $SBENCH_DB, else results/results.duckdb; absolute."""
    return Path(db or envvars.DB.get()).resolve()


# A campaign directory's lock file: submit, retry and cancel of one campaign hold it in turn (harness.sbatch.lock).
CAMPAIGN_LOCK = ".lock"


def process_key_files() -> list[Path]:
    """Where this user's key for local process tokens lives (harness.slurm.localjob), in order of preference:
    ``$XDG_CACHE_HOME/sbench/process.key`` (else ``~/.cache/...``), then a private directory under the
    system's temporary directory. Outside every work dir: nothing a work dir holds can stand in for it."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return [Path(base) / "sbench" / "process.key",
            Path(tempfile.gettempdir()) / f"sbench-{os.getuid()}" / "process.key"]


SPEC_SCHEMA = "sbench.spec/1"  # the "schema" of every spec.json render writes


def package_dir() -> Path:
    """sbench's own package directory, ``harness/`` (what a trainer environment's PYTHONPATH links to)."""
    return Path(__file__).resolve().parent.parent


def safe_name(text: str) -> str:
    """A host or rank name usable as part of a file name."""
    return _SAFE.sub("_", str(text)) or "_"


VISION_PREFIX = "vision-"  # every vision dataset id begins so (harness.data.datagen's grammar of ids)


def dataset_filename(dataset_id: str) -> str:
    """The file of a dataset id in the data dir: ``<id>.parquet`` for vision ids (images and text), else
    ``<id>.jsonl``."""
    return f"{dataset_id}.{dataset_format(dataset_id)}"


def dataset_format(dataset_id: str) -> str:
    """``parquet`` for vision ids (``vision-...``), else ``jsonl``."""
    return "parquet" if dataset_id.startswith(VISION_PREFIX) else "jsonl"


def job_dir_name(point_id: str, repeat: int, attempt: int) -> str:
    return f"{point_id}.r{repeat}.a{attempt}"


def run_id(campaign: str, point_id: str, repeat: int, attempt: int) -> str:
    """A run's id everywhere (the DB's ``runs.run_id``): its campaign and its job dir's name."""
    return f"{campaign}/{job_dir_name(point_id, repeat, attempt)}"


def parse_job_dir_name(name: str) -> tuple[str, int, int] | None:
    m = re.match(r"^([0-9a-f]{16})\.r(\d+)\.a(\d+)$", name)
    if not m:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3))


class JobPaths:
    """Every file of one attempt's job directory.

    Written at render time: ``spec.json``, ``job.sbatch``, ``launch.sh``,
    ``accelerate.yaml`` (multi-device only) and ``env/<host>.sh``.
    Written by the runner on each node (keyed by the SLURM node name, never by
    ``hostname``, which namespaced test nodes share): ``stages.<host>.jsonl``,
    ``samples.<host>.csv``, ``result.<host>.json``, ``train.<host>.log``
    (the training processes' stdout/stderr, NCCL lines included) and
    ``error.<rank>.json``. Rank 0 writes ``log_history.json``.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"JobPaths({str(self.root)!r})"

    # -- rendered -------------------------------------------------------------
    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def sbatch(self) -> Path:
        return self.root / "job.sbatch"

    @property
    def launch(self) -> Path:
        return self.root / "launch.sh"

    @property
    def accelerate(self) -> Path:
        return self.root / "accelerate.yaml"

    @property
    def deepspeed(self) -> Path:
        return self.root / "deepspeed.json"

    @property
    def env_dir(self) -> Path:
        return self.root / "env"

    def env(self, host: str) -> Path:
        return self.env_dir / f"{safe_name(host)}.sh"

    # -- written by the run ---------------------------------------------------
    def stages(self, host: str) -> Path:
        return self.root / f"stages.{safe_name(host)}.jsonl"

    def samples(self, host: str) -> Path:
        return self.root / f"samples.{safe_name(host)}.csv"

    def result(self, host: str) -> Path:
        return self.root / f"result.{safe_name(host)}.json"

    def environment(self, host: str) -> Path:
        return self.root / f"environment.{safe_name(host)}.json"

    def profile_trace(self, host: str, rank: int) -> Path:
        """torch.profiler's Chrome trace of one rank's profiled steps, gzipped (runner.profile)."""
        return self.root / f"profile.{safe_name(host)}.rank{rank}.pt.trace.json.gz"

    def profile_nsys(self, host: str) -> Path:
        """Nsight Systems' report of one host's training (runner.profile.tool: nsys); nsys adds ``.nsys-rep``."""
        return self.root / f"profile.{safe_name(host)}"

    def profile_files(self) -> list[Path]:
        """Every profile file of the job dir: traces and Nsight reports, in name order."""
        return sorted(p for p in self.root.glob("profile.*") if p.name.endswith((".pt.trace.json.gz", ".nsys-rep")))

    def train_log(self, host: str) -> Path:
        return self.root / f"train.{safe_name(host)}.log"

    def error(self, rank: int | str) -> Path:
        return self.root / f"error.{safe_name(str(rank))}.json"

    def rank_result(self, rank: int | str) -> Path:
        return self.root / f"rank.{safe_name(str(rank))}.json"

    @property
    def log_history(self) -> Path:
        return self.root / "log_history.json"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    def hf_cache(self, host: str) -> Path:
        return self.root / ".cache" / safe_name(host)

    def slurm_out(self, job_id: str) -> Path:
        return self.root / f"slurm-{job_id}.out"

    @property
    def submitted(self) -> Path:
        """Written by submit: scheduler, job id and time of the submission."""
        return self.root / "submitted.json"

    # -- discovery (collect) --------------------------------------------------
    def _hosts(self, prefix: str, suffix: str) -> list[str]:
        n, m = len(prefix), len(suffix)
        return sorted(p.name[n:-m] for p in self.root.glob(f"{prefix}*{suffix}"))

    def stage_hosts(self) -> list[str]:
        return self._hosts("stages.", ".jsonl")

    def sample_hosts(self) -> list[str]:
        return self._hosts("samples.", ".csv")

    def result_hosts(self) -> list[str]:
        return self._hosts("result.", ".json")

    def error_ranks(self) -> list[str]:
        return self._hosts("error.", ".json")

    def rank_ids(self) -> list[str]:
        return self._hosts("rank.", ".json")

    def environment_hosts(self) -> list[str]:
        return self._hosts("environment.", ".json")

    def rendered_hosts(self) -> list[str]:
        return sorted(p.stem for p in self.env_dir.glob("*.sh"))

    def slurm_outputs(self) -> list[Path]:
        return sorted(self.root.glob("slurm-*.out"))


def pack_dirs(value: str | None) -> list[str]:
    """The job dirs of a pack from ``SBENCH_PACK`` (a JSON list of paths); [] when unset or not such a list."""
    if not value:
        return []
    try:
        doc = json.loads(value)
    except ValueError:
        return []
    return [str(d) for d in doc] if isinstance(doc, list) and all(isinstance(d, str) for d in doc) else []
