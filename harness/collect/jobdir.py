"""Reading one job directory into a typed :class:`JobFiles`: the spec, the per-host and per-rank files,
what was wrong with any of them. Nothing here decides an outcome (see ``outcome.py``) or builds a row
(see ``rows.py``); nothing here raises on bad content: a file that cannot be used is a problem line."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.contract import safefile
from harness.contract.paths import JobPaths
from harness.contract.records import SubmittedInfo, read_submitted
from harness.spec.catalog import EXPERIMENTS

from .discover import Attempt, named, names_like, scan
from .parse import StageLog, nccl_transport, parse_stages, read_file, read_json


@dataclass
class JobFiles:
    """Everything one attempt's job directory holds, as read."""

    attempt: Attempt
    paths: JobPaths | None
    jobspec: dict[str, Any] = field(default_factory=dict)  # spec.json's "jobspec"
    entity: dict[str, Any] = field(default_factory=dict)
    experiment: str | None = None
    submitted: SubmittedInfo = field(default_factory=lambda: SubmittedInfo())  # submitted.json
    num_machines: int = 1
    expected_trials: int = 1
    stage_logs: dict[str, StageLog] = field(default_factory=dict)  # host -> stages.<host>.jsonl
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> result.<host>.json
    envs: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> environment.<host>.json
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> rank.<r>.json
    rank0: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)  # error.<r>.json, with "_rank" (file's name)
    trials: list[dict[str, Any]] = field(default_factory=list)  # the stability experiment's trial records
    sample_hosts: list[str] = field(default_factory=list)
    log_hosts: list[str] = field(default_factory=list)
    transports: dict[str, str | None] = field(default_factory=dict)  # host -> NCCL transport from its log
    nccl_lines: dict[str, str | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # runner files that could not be used
    warnings: list[str] = field(default_factory=list)  # spec/submitted files that could not be used
    killed_by: int | None = None  # the signal that ended a run no scheduler accounts for
    slurm_tail: str | None = None  # last line of the batch output, read when no runner file exists

    @property
    def hosts_all(self) -> set[str]:
        """Every host that left any file."""
        return set(self.stage_logs) | set(self.results) | set(self.sample_hosts) | set(self.envs) | \
            set(self.log_hosts)

    @property
    def is_stability(self) -> bool:
        exp = EXPERIMENTS.get(str(self.experiment)) if self.experiment else None
        return exp is not None and exp.trials > 1


def as_dict(value: Any) -> dict[str, Any]:
    """*value* when a runner file holds an object there, else an empty one."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """*value* when a runner file holds a list there, else an empty one."""
    return value if isinstance(value, list) else []


def first_line(text: Any, limit: int = 300) -> str:
    s = str(text or "").strip().splitlines()
    line = s[0] if s else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def count(value: Any, minimum: int = 1, maximum: int = 2**31 - 1) -> int | None:
    """A count or index from a runner file (an integer in [minimum, maximum]); None for anything else."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        return None
    return value


def _slurm_tail(root: str, names: list[str], top: str | None, problems: list[str]) -> str | None:
    """The last line of the batch script's output: why a job that never started its runner failed. Only
    its last bytes are read (harness.contract.safefile.LOG_TAIL)."""
    for _job, name in reversed(named(names, JobPaths(root).slurm_out)):
        data, problem = read_file(os.path.join(root, name), top, safefile.LOG_TAIL, part="tail")
        if problem:
            problems.append(problem)
        lines = [x for x in (data or b"").decode("utf-8", errors="replace").splitlines() if x.strip()]
        if lines:
            return f"{name}: {first_line(lines[-1])}"
    return None


def _object(path: str | os.PathLike[str], problems: list[str], top: str | None,
            limit: int = safefile.RUNNER_MAX) -> dict[str, Any] | None:
    doc, p = read_json(path, top, limit)
    if p:
        problems.append(p)
    if isinstance(doc, dict):
        return doc
    if doc is not None:
        problems.append(f"{os.path.basename(path)}: not a JSON object")
    return None


def read_job(att: Attempt, known_point: Mapping[str, Any] | None = None) -> JobFiles:
    """Read *att*'s job directory (none: only what the manifest says)."""
    jd = att.job_dir if att.refused is None else None  # a refused job dir is not read (discover.verify)
    paths = JobPaths(jd) if jd is not None else None
    f = JobFiles(attempt=att, paths=paths)
    if att.refused is not None:
        f.warnings.append(att.refused)
    man, kp = att.manifest or {}, known_point or {}
    spec: dict[str, Any] = {}
    top = att.top
    if paths is not None:
        spec = att.spec if att.spec is not None else _object(paths.spec, f.warnings, top, safefile.SPEC_MAX) or {}
        f.submitted = read_submitted(paths.root, top, f.warnings)
    f.jobspec = as_dict(spec.get("jobspec"))
    point = as_dict(spec.get("point"))
    f.entity = dict(point.get("entity") or f.jobspec.get("entity") or kp.get("entity") or {})
    f.experiment = point.get("experiment") or f.jobspec.get("experiment") or man.get("experiment") or \
        kp.get("experiment")
    f.num_machines = count(f.jobspec.get("num_machines")) or count(f.entity.get("number_nodes")) or 1
    exp = EXPERIMENTS.get(str(f.experiment)) if f.experiment else None
    f.expected_trials = count(f.jobspec.get("trials")) or (exp.trials if exp else 1)
    if paths is None:
        return f
    names = att.files if att.files is not None else (scan(jd)[1] or [])
    f.problems += att.unread
    root = str(jd)
    join = os.path.join  # plain strings: a Path per file costs more than reading a small file
    for h, name in named(names, paths.stages):
        f.stage_logs[h] = parse_stages(join(root, name), h, top)
        f.problems += f.stage_logs[h].problems
    # SLURM may start a requeued job again on other nodes: a host whose stages stop at an earlier restart took
    # no part in the last execution, and what it wrote then (its result, its ranks' errors) is not this run's.
    last = max((log.last_restart for log in f.stage_logs.values()), default=0)
    stale = {h for h, log in f.stage_logs.items() if log.last_restart < last}
    for h, name in named(names, paths.result):
        if h in stale:
            f.warnings.append(f"{name}: written by execution {f.stage_logs[h].last_restart} of a job SLURM started "
                              f"again ({last}) without this host: not read")
        elif (doc := _object(join(root, name), f.problems, top)) is not None:
            f.results[h] = doc
    for h, name in named(names, paths.environment):
        doc, p = read_json(join(root, name), top)
        if p:
            f.problems.append(p)
        if isinstance(doc, dict):
            f.envs[h] = doc
    f.sample_hosts = names_like(names, paths.samples)
    logs = named(names, paths.train_log)
    f.log_hosts = [h for h, _ in logs]
    for _r, name in named(names, paths.rank_result):
        doc, p = read_json(join(root, name), top)
        if p:
            f.problems.append(p)
        if isinstance(doc, dict) and (rk := count(doc.get("rank"), 0)) is not None and doc.get("host") not in stale:
            f.ranks[rk] = doc
    for res in f.results.values():
        for doc in res.get("ranks") or []:
            if isinstance(doc, dict) and (rk := count(doc.get("rank"), 0)) is not None:
                f.ranks.setdefault(rk, doc)
    f.rank0 = f.ranks.get(0)
    if f.rank0 is None:
        for res in f.results.values():
            if isinstance(res.get("training"), dict):
                f.rank0 = res["training"]
    for r, name in named(names, paths.error):
        doc, p = read_json(join(root, name), top)
        if p:
            f.problems.append(p)
        if isinstance(doc, dict) and doc.get("host") not in stale:
            f.errors.append({**doc, "_rank": r})
    for res in f.results.values():
        if isinstance(res.get("trials"), list) and res["trials"]:
            f.trials = [t for t in res["trials"] if isinstance(t, dict)]
    # The node runner's signal, else launch.sh's as the local executor recorded it.
    f.killed_by = next((count(r.get("terminated_by") or r.get("signal"), 1, 255) for r in f.results.values()
                        if r.get("terminated_by") or r.get("signal")), None) or \
        count(f.submitted.get("exit_signal"), 1, 255)
    for h, name in logs:
        f.transports[h], f.nccl_lines[h] = nccl_transport(join(root, name), top, f.problems)
    if not f.hosts_all:
        f.slurm_tail = _slurm_tail(root, names, top, f.problems)
    return f
