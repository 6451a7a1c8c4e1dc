"""Where sbench's files are: one class owns the layout of a job directory (:class:`JobPaths`: the runner and
collect both use it), another the campaign directory around the job directories (:class:`CampaignPaths`: its
manifest, lock, queue and log folders, and the one way campaigns are listed); beside them the login node's
default DB and work dir, and a dataset's file name in the data dir."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import envvars, usercache

_SAFE = re.compile(r"[^A-Za-z0-9._-]")

# Login-node defaults (the CLI's --db / --workdir, or $SBENCH_DB / $SBENCH_WORKDIR, override them).
DEFAULT_DB = Path(envvars.DB.default)
DEFAULT_WORKDIR = Path(envvars.WORKDIR.default)


def resolve_workdir(workdir: str | Path | None = None) -> Path:
    """The work dir: *workdir*, else $SBENCH_WORKDIR, else results/runs; absolute."""
    return Path(workdir or envvars.WORKDIR.get()).resolve()


LAKE_SCHEME = "ducklake:postgres:"  # --db of a shared store: this, then a libpq conninfo of its catalog


@dataclass(frozen=True)
class Lake:
    """A shared results store: a DuckLake whose catalog is the Postgres database *conninfo* (a libpq
    connection string: ``service=sbench``, ``dbname=lake host=db1 port=5432 user=bench``) and whose Parquet
    files live under *data* (a directory every login node reads; None: the one the catalog recorded when the
    lake was made). Credentials come from libpq's own places (a service file, ``PGPASSFILE``, ``PGPASSWORD``),
    never from sbench's: a conninfo naming a password is refused (:func:`parse_lake`), so that the text of a
    --db is safe to print, log and record."""

    conninfo: str
    data: Path | None = None

    def __str__(self) -> str:
        return LAKE_SCHEME + self.conninfo

    @property
    def name(self) -> str:  # what a message calls it, like a file's name
        return str(self)


DbTarget = Path | Lake  # what --db names: a DuckDB file, or a lake
DbArg = str | Path  # a --db as the CLI hands it on: a file's path, or a lake's text (resolve_db makes it a DbTarget)
DbRef = str | Path | Lake  # anything resolve_db takes


def is_lake_text(text: str) -> bool:
    return text.startswith("ducklake:")


def parse_lake(text: str, data: str | Path | None = None) -> Lake:
    """The :class:`Lake` a ``--db ducklake:postgres:<conninfo>`` names, its data directory *data* (else
    $SBENCH_DB_DATA); :class:`ValueError` with the fix for one sbench cannot use."""
    if not text.startswith(LAKE_SCHEME):
        raise ValueError(f"{text!r}: a shared store is named ducklake:postgres:<libpq conninfo> (for example "
                         "ducklake:postgres:service=sbench); DuckLake's other catalogs are not supported")
    conninfo = text[len(LAKE_SCHEME):].strip()
    if not conninfo:
        raise ValueError(f"{text!r}: the catalog's connection is missing after {LAKE_SCHEME} (for example "
                         "service=sbench, or dbname=lake host=db1 user=bench)")
    if _PASSWORD.search(conninfo):
        raise ValueError("the catalog's connection names a password: sbench takes none, so that no password "
                         "reaches a job dir, a log or a report. Put it where libpq reads it (~/.pgpass or "
                         "$PGPASSFILE, a service file's entry, or $PGPASSWORD) and leave it out of --db")
    where = data if data is not None else (envvars.DB_DATA.get() or None)
    return Lake(conninfo, Path(where).resolve() if where else None)


_PASSWORD = re.compile(r"(^|[\s?&])password\s*=|://[^/@\s]*:[^/@\s]*@", re.IGNORECASE)


def resolve_db(db: DbRef | None = None, data: str | Path | None = None) -> DbTarget:
    """The results database: *db*, else $SBENCH_DB, else results/results.duckdb: a DuckDB file (absolute), or a
    :class:`Lake` (``ducklake:postgres:...``, with *data* else $SBENCH_DB_DATA as its data directory).
    :class:`ValueError` for a lake sbench cannot use (see :func:`parse_lake`)."""
    if isinstance(db, Lake):
        return db if data is None else Lake(db.conninfo, Path(data).resolve())
    text = str(db) if db else envvars.DB.get()
    if is_lake_text(text):
        return parse_lake(text, data)
    return Path(text).resolve()


def process_key_files() -> list[Path]:
    """Where this user's key for local process tokens lives (harness.slurm.localjob), in order of preference:
    ``$XDG_CACHE_HOME/sbench/process.key`` (else ``~/.cache/...``), then a private directory under the
    system's temporary directory. Outside every work dir: nothing a work dir holds can stand in for it."""
    return [d / "process.key" for d in usercache.dirs()]


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


def slurm_log_name(kind: str, job_id: str) -> str:
    """The name of a campaign's SLURM job output in its ``.slurm`` folder (*kind* ``prepare`` or ``feed``);
    the job script names it with ``%j`` for *job_id*, a reader with the job's id."""
    return f"{kind}-{job_id}.out"


class CampaignPaths:
    """Every file and folder of one campaign's directory, ``<work dir>/<campaign>/``, beside its job
    directories (:meth:`job`), and the one way campaigns are listed (:meth:`listed`).

    - :attr:`manifest`: the append-only record of what was submitted (``harness.contract.records`` reads
      and writes its lines);
    - :attr:`lock`: submit, retry, cancel, the feeder and a pack's requeue of one campaign hold it in turn
      (``harness.campaign.lock``);
    - :attr:`prepare_job`: the ``--prepare-on slurm`` job the campaign's arrays depend on;
    - :attr:`local`: the local executor's queue files, their pidfiles and logs, and submitit's folder
      (:meth:`queue`, :meth:`queue_pidfile`, :attr:`local_submitit`);
    - :attr:`slurm`: the SLURM jobs' output (arrays, the preparation job, the feeder job) and the feed of
      the attempts sbench holds back (:attr:`feed`, :attr:`feed_script`);
    - :attr:`submissions`: submitit's submission files of the campaign's SLURM jobs.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"CampaignPaths({str(self.root)!r})"

    @classmethod
    def of(cls, workdir: str | Path, campaign: str) -> CampaignPaths:
        return cls(Path(workdir) / campaign)

    @classmethod
    def listed(cls, workdir: str | Path, campaign: str | None = None, *, submitted: bool = False,
               ) -> list[CampaignPaths]:
        """The campaigns of *workdir*, by name: its directories (only *campaign*'s, when named), less those whose
        name begins with a dot, which hold sbench's own jobs (``.fabric``, ``.probe``). *submitted*: only those
        with a manifest (a campaign ``submit`` wrote, not a folder of job dirs rendered by hand). A directory that
        is a link is listed: its reader checks where it leads (``harness.contract.safefile``)."""
        wd = Path(workdir)
        if campaign is not None:
            names = [campaign]
        else:
            try:
                names = sorted(e.name for e in os.scandir(wd) if not e.name.startswith("."))
            except OSError:
                return []
        out = [cls(wd / n) for n in names if not n.startswith(".") and (wd / n).is_dir()]
        return [c for c in out if os.path.lexists(c.manifest)] if submitted else out

    @property
    def name(self) -> str:
        """The campaign's name."""
        return self.root.name

    def job(self, point_id: str, repeat: int, attempt: int) -> JobPaths:
        """The job directory of one attempt of the campaign."""
        return JobPaths(self.root / job_dir_name(point_id, repeat, attempt))

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.jsonl"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def prepare_job(self) -> Path:
        return self.root / "prepare-job.json"

    # -- the local executor --------------------------------------------------
    @property
    def local(self) -> Path:
        return self.root / ".local"

    def queue(self, stamp: str) -> Path:
        """A local queue's file (its jobs, as one submit queued them)."""
        return self.local / f"queue-{stamp}.json"

    def queue_log(self, stamp: str) -> Path:
        return self.local / f"queue-{stamp}.log"

    @staticmethod
    def queue_pidfile(queue_file: str | Path) -> Path:
        """A queue's pidfile: ``queue-<stamp>.pid`` beside its ``queue-<stamp>.json``."""
        return Path(queue_file).with_suffix(".pid")

    @staticmethod
    def of_queue(queue_file: str | Path) -> CampaignPaths:
        """The campaign directory a queue file (:meth:`queue`) lies in: every read of its files stays inside it."""
        return CampaignPaths(Path(queue_file).parent.parent)

    @property
    def local_submitit(self) -> Path:
        return self.local / "submitit"

    # -- SLURM ----------------------------------------------------------------
    @property
    def slurm(self) -> Path:
        return self.root / ".slurm"

    @property
    def feed(self) -> Path:
        """The attempts sbench holds back from SLURM until the submit quota has room (``harness.slurm.held``)."""
        return self.slurm / "feed.json"

    @property
    def feed_script(self) -> Path:
        return self.slurm / "feed.sbatch"

    def prepare_log(self, job_id: str) -> Path:
        return self.slurm / slurm_log_name("prepare", job_id)

    @property
    def submissions(self) -> Path:
        """submitit's folder of the campaign's SLURM submissions (their scripts and submitit's logs)."""
        return self.root / ".submitit"


def pack_dirs(value: str | None) -> list[str]:
    """The job dirs of a pack from ``SBENCH_PACK`` (a JSON list of paths); [] when unset or not such a list."""
    if not value:
        return []
    try:
        doc = json.loads(value)
    except ValueError:
        return []
    return [str(d) for d in doc] if isinstance(doc, list) and all(isinstance(d, str) for d in doc) else []
