"""A sweep file: its keys, their checks, and the :class:`Sweep` it becomes (``load_sweep``).

Every message names the file, the line where known, the key and the fix; nothing is planned or written
before the whole file is checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract import envvars
from harness.contract.defaults import (
    AUTO_STOP,
    DEFAULT_PROFILE_STEPS,
    MAX_PROFILE_STEPS,
    MIN_SAMPLE_INTERVAL_S,
    PROFILE_TOOLS,
    STOP_METHODS,
    TRAIN_LOG_LEVELS,
    RunnerSettings,
)
from harness.contract.errors import CatalogError, InputError, SweepError

from .catalog import EXPERIMENTS, Experiment, get_experiment
from .inventory import shared_dir
from .modelmap import ModelMap, load_model_map
from .references import parse_references
from .schema import (
    MAX_LIST,
    NAME,
    SLURM_CONSTRAINT,
    SLURM_CONSTRAINT_TEXT,
    SLURM_NAME,
    SLURM_NAME_TEXT,
    SLURM_TIME,
    SLURM_TIME_TEXT,
    Checker,
    sbatch_extra,
)
from .search import SearchSpec, parse_search, planned_repeats
from .yamlio import LineDict, load_yaml

SWEEP_KEYS = ("campaign", "experiment", "partition", "description", "entity", "grid", "repeats", "slurm",
              "model_map", "data_dir", "runner", "references", "reuse", "search", "budget")
BUDGET_KEYS = ("gpu_hours", "allocation_hours")
MAX_BUDGET_HOURS = 1e9


# What a campaign may take from other campaigns instead of measuring it again: nothing (every campaign
# measures its own points), or a point's measured runs ("measured": a design-space search's memoization).
REUSE_MODES = ("none", "measured")
_SCALAR = (str, int, float)
# The type each top-level key's value has: a near-miss of another type is no suggestion.
SWEEP_KINDS: dict[str, type | tuple[type, ...]] = {
    "campaign": _SCALAR, "experiment": str, "partition": _SCALAR, "description": str, "entity": dict, "grid": dict,
    "repeats": (int, dict), "slurm": dict, "model_map": dict, "data_dir": str, "runner": dict, "references": dict,
    "reuse": str, "search": dict, "budget": dict}


SLURM_KEYS = ("time", "account", "qos", "constraint", "exclusive", "mem_gb", "max_parallel", "requeue", "extra",
              "feed_partition", "pack")


MAX_PACK = 64  # points one allocation runs one after another (slurm.pack: N)
PACK_AUTO = "auto"


RUNNER_KEYS = ("sample_interval_s", "auto_stop", "stop_grace_s", "token_cache", "workload", "idle_seconds",
               "memory_every_steps", "train_log_level", "host_busy_cpu", "profile", "rank_timing", "straggler_score")
PROFILE_KEYS = ("steps", "ranks", "tool")


WORKLOADS = ("train", "idle")


AUTO_STOP_KEYS = ("method", "warmup_seconds", "stable_seconds", "min_steps", "rel_ci", "max_seconds")
# The keys only one auto-stop method reads (min_steps is both's).
AUTO_STOP_METHOD_KEYS = {"fixed": ("warmup_seconds", "stable_seconds"), "precision": ("rel_ci", "max_seconds")}


CAMPAIGN_NAME = NAME  # fullmatch only: '$' would accept a trailing newline


MAX_REPEATS = 1000


REPEATS_KEYS = ("min", "max", "cv")
MAX_REL_CI = 0.5  # the precision auto-stop's widest target: +-50 % of the mean


@dataclass(frozen=True)
class AdaptiveRepeats:
    """``repeats: {min, max, cv}``: each point runs *min* repeats; one more is submitted (by ``sbench submit``
    run again on the sweep, or ``sbench collect``) while the coefficient of variation of its throughput
    across its measured repeats is above *cv*, up to *max* repeats (``harness.campaign.repeats``)."""

    min: int
    max: int
    cv: float

    def to_dict(self) -> dict[str, Any]:
        return {"min": self.min, "max": self.max, "cv": self.cv}


MAX_RUNS = 100_000  # points x repeats of one sweep; a larger grid is a typo, or several campaigns


MAX_PARALLEL = 100_000


def _pack(ck: Checker, node: Mapping[str, Any]) -> int | str:
    """``slurm.pack``: a whole number of points per allocation (1 to MAX_PACK), or ``auto``."""
    value = node.get("pack")
    if value is None:
        return 1
    if value == PACK_AUTO:
        return PACK_AUTO
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PACK:
        ck.fail("slurm.pack", f"must be a whole number from 1 to {MAX_PACK} (points run one after another in one "
                              f"allocation; 1 packs nothing) or {PACK_AUTO!r}, got {value!r}; e.g. 'pack: 4' or "
                              f"'pack: auto'", node, "pack")
    return int(value)


@dataclass(frozen=True)
class SlurmOverrides:
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool | None = None
    mem_gb: float | None = None
    max_parallel: int | None = None
    requeue: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    # the SLURM partition of the feeder job that submits what the submit quota held back
    # (harness.campaign.executors.feed)
    feed_partition: str | None = None
    # points of one resource shape, model, trainer and dtype run one after another in one allocation:
    # 1 (the default) each point its own job, N at most N per allocation, "auto" (harness.campaign.executors.pack)
    pack: int | str = 1


@dataclass
class Sweep:
    campaign: str
    experiment: Experiment
    source: str
    base_dir: Path
    partition: str | None
    entity: dict[str, Any]
    grid: dict[str, list[Any]]
    repeats: int  # the repeats planned per point: N, or an adaptive sweep's max
    slurm: SlurmOverrides
    model_map: ModelMap
    data_dir: Path
    runner: RunnerSettings
    description: str = ""
    data_dir_set: bool = False  # the sweep names its data_dir (else the inventory's defaults.data_dir may)
    references: list[Any] = field(default_factory=list)  # harness.references.Reference, in file order
    reuse: str = "none"  # one of REUSE_MODES
    adaptive: AdaptiveRepeats | None = None  # repeats: {min, max, cv}; None for a plain repeats: N
    # search: (harness.spec.search): repeats above is then the rungs plus search_repeats, the campaign's repeats:
    # N that its best point and runners-up get
    search: SearchSpec | None = None
    search_repeats: int = 0
    lines: dict[str, int] = field(default_factory=dict)
    budget: Budget | None = None  # budget: {gpu_hours, allocation_hours}: submit refuses a campaign predicted past it


@dataclass(frozen=True)
class Budget:
    """What a campaign may spend: GPU-hours (devices x allocation hours) and allocation hours, either or both."""

    gpu_hours: float | None = None
    allocation_hours: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {"gpu_hours": self.gpu_hours, "allocation_hours": self.allocation_hours}


def parse_budget(ck: Any, doc: Any) -> Budget | None:
    node = doc.get("budget")
    if node is None:
        return None
    node = ck.mapping(node, "budget", doc, "budget")
    ck.known_keys(node, "budget", BUDGET_KEYS)
    gpu = ck.number(node, "budget", "gpu_hours", minimum=0, maximum=MAX_BUDGET_HOURS)
    alloc = ck.number(node, "budget", "allocation_hours", minimum=0, maximum=MAX_BUDGET_HOURS)
    if gpu is None and alloc is None:
        ck.fail("budget", "names no budget; give gpu_hours: N (devices x hours), allocation_hours: N, or both",
                doc, "budget")
    return Budget(None if gpu is None else float(gpu), None if alloc is None else float(alloc))


def data_dir_for(sweep: Sweep, inv: Any) -> Path:
    """Where the jobs read datasets and prepared data: the sweep's data_dir, else the inventory's
    defaults.data_dir, else $SBENCH_DATA_DIR / the built-in default."""
    if sweep.data_dir_set:
        return sweep.data_dir
    return shared_dir(inv.data_dir, inv) or sweep.data_dir


def _misplaced(doc: Any) -> dict[str, str]:
    """Top-level keys that are settings of another section: entity fields, slurm: and runner: keys -> the fix."""
    try:
        experiment = get_experiment(str(doc.get("experiment")))
        fields, exp = experiment.field_names, f"a field of {experiment.id}"
    except CatalogError:
        fields = list(dict.fromkeys(f.name for e in EXPERIMENTS.values() for f in e.fields))
        exp = "an entity field"
    out: dict[str, str] = {}
    for k in doc:
        k = str(k)
        if k in SWEEP_KEYS:
            continue
        if k in fields:
            out[k] = (f"is {exp}, not a top-level key; put it under entity: ({k}: {_yaml_value(doc[k])}), or "
                      "under grid: to sweep several values")
        elif k in SLURM_KEYS:
            out[k] = f"is a slurm: setting, not a top-level key; put it under slurm: ({k}: {_yaml_value(doc[k])})"
        elif k in RUNNER_KEYS:
            out[k] = f"is a runner: setting, not a top-level key; put it under runner: ({k}: {_yaml_value(doc[k])})"
    return out


def _yaml_value(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (bool, list, dict)) or value is None else str(value)
    return text if len(text) <= 40 else "..."


def load_sweep(path: str | Path, model_map_path: str | Path | None = None, campaign: str | None = None,
               profile: bool = False) -> Sweep:
    """The sweep in *path*; *campaign* (``submit --campaign``) names its campaign in place of its ``campaign:``,
    so that one sweep file serves a series of campaigns (``nightly-1122``, ``nightly-1123``)."""
    p = Path(path)
    doc = load_yaml(p, SweepError, "sweep")
    sweep = parse_sweep(doc, str(p), p.parent.resolve(), model_map_path, profile=profile)
    if campaign is not None:
        if not CAMPAIGN_NAME.fullmatch(campaign):
            raise InputError(f"--campaign must use letters, digits, '.', '_' or '-' (max 100), got {campaign!r}")
        sweep.campaign = campaign
    return sweep


def _host_busy_cpu(ck: Checker, runner_node: Any) -> float:
    """``runner.host_busy_cpu``: a share of a host's CPU capacity in (0, 1]; default ``$SBENCH_HOST_BUSY_CPU``."""
    try:
        default = float(envvars.HOST_BUSY_CPU.get())
    except ValueError:
        raise InputError(f"{envvars.HOST_BUSY_CPU.name} must be a number in (0, 1], got "
                         f"{envvars.HOST_BUSY_CPU.get()!r}") from None
    value = float(ck.number(runner_node, "runner", "host_busy_cpu", default=default))
    if not 0 < value <= 1:
        ck.fail("runner.host_busy_cpu", f"must be a share of the host's CPU capacity above 0 and at most 1 (0.25: "
                                        f"other work on a quarter of its cores; 1: never flagged), got {value:g}",
                runner_node, "host_busy_cpu")
    return value


def parse_profile(ck: Checker, runner_node: Mapping[str, Any], profile_flag: bool) -> dict[str, Any]:
    """``runner.profile: {steps: [a, b], ranks: [0], tool: torch | nsys}`` as RunnerSettings' fields (without the
    repeat, which the repeats decide); *profile_flag* (``submit --profile``) profiles steps
    :data:`DEFAULT_PROFILE_STEPS` when the sweep names none."""
    if runner_node.get("profile") is None and not profile_flag:
        return {}
    node = ck.mapping(runner_node.get("profile"), "runner.profile", runner_node, "profile")
    ck.known_keys(node, "runner.profile", PROFILE_KEYS)
    steps = node.get("steps", list(DEFAULT_PROFILE_STEPS))
    if (not isinstance(steps, list) or len(steps) != 2 or any(isinstance(x, bool) or not isinstance(x, int)
                                                              for x in steps)
            or not 1 <= steps[0] <= steps[1] or steps[1] - steps[0] >= MAX_PROFILE_STEPS):
        ck.fail("runner.profile.steps", f"must be [first, last]: optimizer steps counted from 1, first <= last, at "
                                        f"most {MAX_PROFILE_STEPS} steps (e.g. steps: [45, 50]); got {steps!r}",
                node, "steps")
    ranks = node.get("ranks", [0])
    if (not isinstance(ranks, list) or not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 0
                                                        for r in ranks)):
        ck.fail("runner.profile.ranks", f"must be a list of global ranks (whole numbers >= 0), e.g. ranks: [0]; got "
                                        f"{ranks!r}", node, "ranks")
    tool = ck.choice(node, "runner.profile", "tool", PROFILE_TOOLS, default="torch")
    return {"profile_start": int(steps[0]), "profile_end": int(steps[1]),
            "profile_ranks": ",".join(str(r) for r in dict.fromkeys(ranks)), "profile_tool": tool}
def _straggler_score(ck: Checker, runner_node: Any) -> float:
    """``runner.straggler_score``: a score in (0, 1); default ``$SBENCH_STRAGGLER_SCORE``."""
    try:
        default = float(envvars.STRAGGLER_SCORE.get())
    except ValueError:
        default = -1.0
    if not 0 < default < 1:
        raise InputError(f"{envvars.STRAGGLER_SCORE.name} must be a number between 0 and 1 (both excluded), got "
                         f"{envvars.STRAGGLER_SCORE.get()!r}")
    value = float(ck.number(runner_node, "runner", "straggler_score", default=default))
    if not 0 < value < 1:
        ck.fail("runner.straggler_score", f"must be a score between 0 and 1, both excluded (0.7: a rank that takes "
                                          f"more than 1/0.7 = 1.43 times the fastest rank's time), got {value:g}",
                runner_node, "straggler_score")
    return value


def parse_repeats(ck: Checker, doc: Any) -> AdaptiveRepeats | None:
    """``repeats: {min, max, cv}`` (None for a plain ``repeats: N`` or none)."""
    node = doc.get("repeats")
    if not isinstance(node, dict):
        return None
    ck.known_keys(node, "repeats", REPEATS_KEYS)
    for k in REPEATS_KEYS:
        ck.require(node, "repeats", k, "repeats: {min: 2, max: 6, cv: 0.02} (or a plain repeats: N)")
    lo = ck.integer(node, "repeats", "min", minimum=1, maximum=MAX_REPEATS)
    if lo < 2:
        # a CV needs two measured repeats: with min 1 the point stops at one repeat with no CV, for good
        ck.fail("repeats.min", f"must be >= 2 with cv: a coefficient of variation needs two measured repeats, got "
                               f"{lo}; set min: 2 (or a plain repeats: {lo})", node, "min")
    hi = ck.integer(node, "repeats", "max", minimum=1, maximum=MAX_REPEATS)
    if hi < lo:
        ck.fail("repeats.max", f"must be >= repeats.min ({lo}), got {hi}; raise max or lower min", node, "max")
    cv = float(ck.number(node, "repeats", "cv"))
    if not 0 < cv < 1:
        ck.fail("repeats.cv", f"must be a fraction between 0 and 1, both excluded (e.g. 0.02 for a CV of 2 %), got "
                              f"{cv:g}", node, "cv")
    return AdaptiveRepeats(lo, hi, cv)


def parse_sweep(doc: Any, source: str, base_dir: Path, model_map_path: str | Path | None = None,
                profile: bool = False) -> Sweep:
    ck = Checker(source, SweepError)
    if doc is None:
        ck.fail("(document)", "is empty; expected campaign:, experiment: and entity:")
    doc = ck.mapping(doc, "(document)")
    if "reuse_measured" in doc:  # the flag's name as a key: say the sweep's own form
        ck.fail("reuse_measured", "is not a known key; write 'reuse: measured' (the sweep's form of "
                                  "--reuse-measured)", doc, "reuse_measured")
    ck.known_keys(doc, "", SWEEP_KEYS, SWEEP_KINDS, _misplaced(doc))
    campaign = ck.require(doc, "", "campaign", "a unique name for this sweep's results")
    campaign = ck.string(doc, "", "campaign")
    if not CAMPAIGN_NAME.fullmatch(campaign):
        ck.fail("campaign", f"must use letters, digits, '.', '_' or '-' (max 100), got {campaign!r}", doc, "campaign")
    ck.require(doc, "", "experiment", "e.g. finetune_lora_benchmark-v1.0.0; see 'sbench experiments list'")
    exp_id = ck.string(doc, "", "experiment")
    try:
        experiment = get_experiment(exp_id)
    except CatalogError as exc:
        ck.fail("experiment", str(exc).replace("unknown experiment", "names an unknown experiment"), doc, "experiment")
    entity = dict(ck.mapping(doc.get("entity"), "entity", doc, "entity"))
    grid_node = ck.mapping(doc.get("grid"), "grid", doc, "grid")
    grid: dict[str, list[Any]] = {}
    combos = 1
    for k, v in grid_node.items():
        values = v if isinstance(v, list) else [v]
        if not values:
            ck.fail(f"grid.{k}", "is an empty list; give at least one value", grid_node, k)
        if len(values) > MAX_LIST:
            ck.fail(f"grid.{k}", f"has {len(values)} values; at most {MAX_LIST} are allowed", grid_node, k)
        grid[str(k)] = values
        combos *= len(values)
    known = experiment.field_names
    for section, node in (("entity", entity), ("grid", grid)):
        for k in node:
            if k not in known:
                close = difflib.get_close_matches(k, known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                ck.fail(f"{section}.{k}", f"is not a field of {experiment.id}; {hint}valid fields: {', '.join(known)}",
                        doc.get(section), k)
    both = sorted(set(entity) & set(grid))
    if both:
        ck.fail(f"grid.{both[0]}", "is set in both entity: and grid:; keep it in one place", grid_node, both[0])
    adaptive = parse_repeats(ck, doc)
    repeats = adaptive.max if adaptive else ck.integer(doc, "", "repeats", default=1, minimum=1, maximum=MAX_REPEATS)
    search = parse_search(ck, doc, grid, entity)
    if search is not None:
        if adaptive:
            ck.fail("repeats", "a search gives its best point a plain repeats: N (its rungs are its own repeats); "
                               "repeats: {min, max, cv} does not go with search:", doc, "repeats")
        # rung r is repeat r of a point; the campaign's repeats come after the last rung
        search_repeats, repeats = repeats, planned_repeats(search, grid, repeats)
    if combos * repeats > MAX_RUNS:
        ck.fail("grid", f"expands to {combos} grid combinations x {repeats} repeat(s) = {combos * repeats} runs; at "
                        f"most {MAX_RUNS} are allowed in one sweep - split it into several campaigns",
                doc, "grid" if "grid" in doc else "repeats")
    slurm_node = ck.mapping(doc.get("slurm"), "slurm", doc, "slurm")
    ck.known_keys(slurm_node, "slurm", SLURM_KEYS)
    slurm = SlurmOverrides(
        time=ck.string(slurm_node, "slurm", "time", pattern=SLURM_TIME, what=SLURM_TIME_TEXT),
        account=ck.string(slurm_node, "slurm", "account", pattern=SLURM_NAME, what=SLURM_NAME_TEXT),
        qos=ck.string(slurm_node, "slurm", "qos", pattern=SLURM_NAME, what=SLURM_NAME_TEXT),
        constraint=ck.string(slurm_node, "slurm", "constraint", pattern=SLURM_CONSTRAINT,
                             what=SLURM_CONSTRAINT_TEXT),
        exclusive=ck.boolean(slurm_node, "slurm", "exclusive"),
        mem_gb=ck.number(slurm_node, "slurm", "mem_gb", minimum=0, maximum=1 << 20),
        max_parallel=ck.integer(slurm_node, "slurm", "max_parallel", minimum=1, maximum=MAX_PARALLEL),
        requeue=ck.boolean(slurm_node, "slurm", "requeue", default=False),
        extra=sbatch_extra(ck, slurm_node, "slurm", "extra"),
        feed_partition=ck.string(slurm_node, "slurm", "feed_partition", pattern=SLURM_NAME, what=SLURM_NAME_TEXT),
        pack=_pack(ck, slurm_node),
    )
    if search is not None and search.batch_size == "fit" and slurm.pack != 1:
        # packed: each shape's batches are scanned in ascending order in one pack, not bisected wave by wave
        search = dataclasses.replace(search, scan=True)
    runner_node = ck.mapping(doc.get("runner"), "runner", doc, "runner")
    ck.known_keys(runner_node, "runner", RUNNER_KEYS)
    auto = ck.mapping(runner_node.get("auto_stop"), "runner.auto_stop", runner_node, "auto_stop")
    ck.known_keys(auto, "runner.auto_stop", AUTO_STOP_KEYS)
    d = RunnerSettings()  # the defaults
    interval = ck.number(runner_node, "runner", "sample_interval_s", default=d.sample_interval_s,
                         minimum=MIN_SAMPLE_INTERVAL_S, maximum=3600)
    day = 86400.0
    method = ck.choice(auto, "runner.auto_stop", "method", STOP_METHODS, default=d.stop_method)
    for other, keys in AUTO_STOP_METHOD_KEYS.items():
        for k in keys:
            if other != method and k in auto:
                ck.fail(f"runner.auto_stop.{k}", f"applies to method: {other}, not {method}; remove it or set "
                                                 f"runner.auto_stop.method: {other}", auto, k)
    rel_ci = float(ck.number(auto, "runner.auto_stop", "rel_ci", default=d.rel_ci))
    if not 0 < rel_ci <= MAX_REL_CI:
        ck.fail("runner.auto_stop.rel_ci", f"must be a fraction of the mean above 0 and at most {MAX_REL_CI:g} (e.g. "
                                           f"0.02 for +-2 %; an interval wider than +-{MAX_REL_CI:.0%} measures "
                                           f"nothing), got {rel_ci:g}", auto, "rel_ci")
    max_seconds = float(ck.number(auto, "runner.auto_stop", "max_seconds", default=d.max_seconds, minimum=0,
                                  maximum=day))
    if not max_seconds > 0:
        ck.fail("runner.auto_stop.max_seconds", f"must be a number of seconds > 0, got {max_seconds:g}", auto,
                "max_seconds")
    if method == "precision" and entity.get("auto_stop_method") != AUTO_STOP and AUTO_STOP not in (
            grid.get("auto_stop_method") or []):
        ck.fail("runner.auto_stop.method", f"precision says how a point with auto_stop_method {AUTO_STOP} stops, "
                                           "and no point of this sweep sets it; add entity: {auto_stop_method: "
                                           f"{AUTO_STOP}}} (or put it in grid:)", auto, "method")
    runner = RunnerSettings(
        sample_interval_s=float(interval),
        stop_method=method, rel_ci=rel_ci, max_seconds=max_seconds,
        warmup_seconds=float(ck.number(auto, "runner.auto_stop", "warmup_seconds", default=d.warmup_seconds,
                                       minimum=0, maximum=day)),
        stable_seconds=float(ck.number(auto, "runner.auto_stop", "stable_seconds", default=d.stable_seconds,
                                       minimum=0, maximum=day)),
        min_steps=ck.integer(auto, "runner.auto_stop", "min_steps", default=d.min_steps, minimum=1,
                             maximum=10**9),
        stop_grace_s=float(ck.number(runner_node, "runner", "stop_grace_s", default=d.stop_grace_s, minimum=0,
                                     maximum=day)),
        token_cache=ck.boolean(runner_node, "runner", "token_cache", default=d.token_cache),
        workload=ck.string(runner_node, "runner", "workload", default=d.workload),
        idle_seconds=float(ck.number(runner_node, "runner", "idle_seconds", default=d.idle_seconds, minimum=0,
                                     maximum=day)),
        memory_every_steps=ck.integer(runner_node, "runner", "memory_every_steps", default=d.memory_every_steps,
                                      minimum=1, maximum=10**9),
        train_log_level=ck.choice(runner_node, "runner", "train_log_level", TRAIN_LOG_LEVELS,
                                  default=d.train_log_level),
        host_busy_cpu=_host_busy_cpu(ck, runner_node),
        **parse_profile(ck, runner_node, profile),
        rank_timing=ck.boolean(runner_node, "runner", "rank_timing", default=d.rank_timing),
        straggler_score=_straggler_score(ck, runner_node),
    )
    if runner.profiled:
        # The last repeat is profiled, so the profiler's cost never reaches a measured repeat; with one repeat, a
        # second one is added for it. Adaptive repeats know their last only once the CV has decided.
        if adaptive is not None:
            ck.fail("runner.profile", "cannot profile with repeats: {min, max, cv}: which repeat is the last is known "
                                      "only once the CV decides; use repeats: N (the last of the N is profiled)",
                    runner_node, "profile")
        if repeats == 1:
            repeats = 2
        runner = dataclasses.replace(runner, profile_repeat=repeats - 1)
    if runner.workload not in WORKLOADS:
        ck.fail("runner.workload", f"must be one of: {', '.join(WORKLOADS)}; got {runner.workload!r}", runner_node,
                "workload")
    try:
        mm = load_model_map(model_map_path)
        if doc.get("model_map") is not None:
            mm = mm.merged(ck.mapping(doc["model_map"], "model_map", doc, "model_map"), source, base_dir)
    except InputError as exc:
        raise SweepError(str(exc)) from None
    data_dir_raw = ck.string(doc, "", "data_dir", max_len=1024)
    if data_dir_raw:
        data_dir = Path(data_dir_raw).expanduser()
        if not data_dir.is_absolute():
            data_dir = (base_dir / data_dir).resolve()
    else:
        data_dir = Path(envvars.DATA_DIR.get()).resolve()
    partition = ck.string(doc, "", "partition")
    if partition is not None:
        ck.name(partition, "partition", doc, "partition", what="partition name")

    references = parse_references(doc.get("references"), experiment, ck, doc)
    return Sweep(
        references=references, reuse=ck.choice(doc, "", "reuse", REUSE_MODES, default="none"),
        campaign=campaign, experiment=experiment, source=source, base_dir=base_dir,
        partition=partition, entity=entity, grid=grid, repeats=repeats, adaptive=adaptive, slurm=slurm,
        search=search, search_repeats=search_repeats if search is not None else 0,
        model_map=mm, data_dir=data_dir, runner=runner, data_dir_set=bool(data_dir_raw),
        description=ck.string(doc, "", "description", default="", nonempty=False, multiline=True) or "",
        lines=dict(doc.lines) if isinstance(doc, LineDict) else {}, budget=parse_budget(ck, doc),
    )
