"""An adaptive campaign: a sweep's ``search:`` section and the decisions it takes from what the campaign holds.

```yaml
search:
  goal: {maximize: dataset_tokens_per_second}   # or minimize; a numeric measurements column
  batch_size: fit      # per shape (every field but batch_size): the largest batch of the grid that fits
  method: halving      # successive halving over the points that are not dominated
  eta: 3               # halving's factor (optional)
```

Pure: :func:`step` takes the grid's points (with the memory predictions ``harness.spec.memory`` made) and what
the database holds of each point's runs, and returns the runs to start now and one decision per point, with the
reason. Nothing here remembers anything between calls: the same history gives the same decisions, so a search
that was interrupted (Ctrl-C, a dead feeder, a cancelled job) goes on from the database with ``submit`` or
``retry``, and a point that was decided is never run again. What a campaign records of its search
(:class:`RecordedSearch`) is written and read back here, and the search's answer (:func:`answer`) is said from what
the database holds of it (:class:`SearchEvidence`).

**Largest batch that fits** (``batch_size: fit``): each shape's batch sizes are bisected. The first run is the
largest batch predicted to fit (where there is a prediction), else the middle one. A real OOM (an ``invalid``
run) bounds the shape from above, an ``ok`` run from below; a point predicted to need more than
:data:`WIDE_MARGIN` times the device's memory is an upper bound without a run unless nothing below it is known to
fit.

**Fastest configuration** (``method: halving``): the entrants are each shape's largest fitting batch and every
other point the bisection measured (its bisection run is its rung 0), or every point without ``batch_size: fit``.
Rung *r* is the points' repeat *r*; after each rung a point leaves when its interval (mean ± the precision
auto-stop's half-width, combined over its runs) lies wholly on the wrong side of the best one's (its upper end
below the best's lower end); the others go on to the next rung, a longer look at them (one more run each). After
``ceil(log_eta(shapes))`` rungs the best point and the runners-up whose intervals overlap it get the campaign's
repeats (``repeats: N``), as repeats after the last rung.

**Evidence** (:func:`used_runs`): a run on a busy host is left out where the point has a quiet one, and used with a
note where it has none. Two runs of a point whose own intervals lie apart (:func:`disagreement`) keep the point
from being cut, or a leader from cutting anyone, until a third run (the spare repeat where its planned ones are
spent) says where it stands.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.contract.stats import Interval

from .catalog import METRICS
from .schema import Checker

SEARCH_KEYS = ("goal", "batch_size", "method", "eta")
GOAL_SENSES = ("maximize", "minimize")
BATCH_MODES = ("fit",)
METHODS = ("halving",)
# A goal's columns: the reference's measured properties, and sbench's own figures of cost and energy.
GOAL_COLUMNS = METRICS + ("cost_per_million_tokens", "dataset_tokens_per_joule", "energy_joules")
DEFAULT_ETA = 3
MAX_ETA = 16
BATCH_FIELD = "batch_size"
# A point predicted to need more than this many times its device's memory is not run to learn that it does not
# fit, unless the bisection has nothing else to go on (nothing below it is known to fit).
WIDE_MARGIN = 1.25

# Two runs of a point that disagree (their intervals apart) get a run more before the point is cut or ranked, up to
# this many runs used; a search plans one spare repeat per point for it.
AGREE_RUNS = 3
SPARE_REPEATS = 1
MIN_STEPS = 2  # a short run's fewest steps: a step time, and a second to tell its spread
# How the reason of a point whose next run the sweep's budget: stopped begins (harness.campaign.submit writes it).
BUDGET_STOP = "stopped at the budget: "
# A decision's phase and action, as the search_decisions table and sbench best say them.
FIT, HALVING, FINAL = "fit", "halving", "final"
PLAN = "plan"  # a point the plan found invalid: none of the search's, recorded with the plan's reasons
RUN, SKIP, STOP, WAIT, KEEP = "run", "skipped", "stopped", "waiting", "kept"


@dataclass(frozen=True)
class SearchSpec:
    """A sweep's ``search:``: the goal (a measurements column and whether more is better, and any further objectives
    of a Pareto search), how the batch size is chosen and how the best point is found."""

    metric: str  # the first objective's column: it ranks the points and names the best
    sense: str  # maximize | minimize
    batch_size: str | None = None  # fit | None (batch_size is a grid field like any other)
    method: str | None = None  # halving | None (every entrant gets the campaign's repeats)
    eta: int = DEFAULT_ETA
    more: tuple[tuple[str, str], ...] = ()  # further objectives, (sense, column): a Pareto search
    # batch_size: fit in a packed sweep (slurm.pack): each shape's open batches all at once, in ascending order in
    # one pack, where a batch after one that ran out of memory is not run (harness.campaign.executors.pack)
    scan: bool = False

    @property
    def objectives(self) -> tuple[tuple[str, str], ...]:
        """Every objective as (sense, column), the first one first."""
        return ((self.sense, self.metric),) + self.more

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(m for _, m in self.objectives)

    @property
    def pareto(self) -> bool:
        return bool(self.more)

    def goal(self) -> dict[str, Any]:
        """``goal:`` as the sweep says it: ``{sense: column}``, or ``{sense: [columns]}`` per sense (the first
        objective first)."""
        out: dict[str, list[str]] = {}
        for sense, metric in self.objectives:
            out.setdefault(sense, []).append(metric)
        return {k: v[0] if len(v) == 1 else v for k, v in out.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"goal": self.goal(), "batch_size": self.batch_size, "method": self.method, "eta": self.eta,
                **({"scan": True} if self.scan else {})}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> SearchSpec:
        """The spec :meth:`to_dict` recorded (an eta not recorded: :data:`DEFAULT_ETA`)."""
        objectives = goal_objectives(doc["goal"])
        (sense, metric), more = objectives[0], tuple(objectives[1:])
        return cls(metric, sense, doc.get("batch_size"), doc.get("method"), int(doc.get("eta") or DEFAULT_ETA),
                   more, bool(doc.get("scan")))

    def rungs(self, entrants: int) -> int:
        """How many halving rungs *entrants* points go through before the final repeats (0: one point, or no
        halving)."""
        if self.method is None or entrants <= 1:
            return 0
        return max(1, math.ceil(math.log(entrants) / math.log(self.eta) - 1e-9))

    def better(self, a: float, b: float) -> bool:
        return a > b if self.sense == "maximize" else a < b


def goal_objectives(goal: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``goal:``'s objectives as (sense, column), in the order written: a sense names one column or a list."""
    return [(str(sense), str(m)) for sense, v in goal.items() for m in (v if isinstance(v, list) else [v])]


def parse_search(ck: Checker, doc: Mapping[str, Any], grid: Mapping[str, list[Any]],
                 entity: Mapping[str, Any]) -> SearchSpec | None:
    """``search:`` (None when the sweep has none): unknown keys, a goal that is not a numeric measurements column
    and a method the grid does not allow are refused, naming the key."""
    if doc.get("search") is None:
        return None
    node = ck.mapping(doc.get("search"), "search", doc, "search")
    ck.known_keys(node, "search", SEARCH_KEYS)
    ck.require(node, "search", "goal", "goal: {maximize: dataset_tokens_per_second} (or minimize: a column)")
    goal = ck.mapping(node.get("goal"), "search.goal", node, "goal")
    ck.known_keys(goal, "search.goal", GOAL_SENSES)
    if not goal:
        ck.fail("search.goal", f"must name one of {', '.join(GOAL_SENSES)} with a measurements column, e.g. "
                               "{maximize: dataset_tokens_per_second}", node, "goal")
    seen: set[str] = set()
    for sense, value in goal.items():
        columns = value if isinstance(value, list) and value else [value]
        for metric in columns:
            if not isinstance(metric, str) or metric not in GOAL_COLUMNS:
                ck.fail(f"search.goal.{sense}", f"must be a numeric measurements column (or a list of them), got "
                                                f"{metric!r}; valid: {', '.join(GOAL_COLUMNS)}", goal, sense)
            if metric in seen:
                ck.fail(f"search.goal.{sense}", f"names {metric} twice; an objective is maximized or minimized "
                                                "once", goal, sense)
            seen.add(metric)
    (sense, metric), *more = goal_objectives(goal)
    batch = ck.choice(node, "search", "batch_size", BATCH_MODES)
    method = ck.choice(node, "search", "method", METHODS)
    eta = ck.integer(node, "search", "eta", default=DEFAULT_ETA, minimum=2, maximum=MAX_ETA)
    if eta != DEFAULT_ETA and method is None:
        ck.fail("search.eta", "applies to method: halving; remove it or set search.method: halving", node, "eta")
    if batch == "fit" and len(grid.get(BATCH_FIELD) or []) < 2:
        where = "is fixed in entity:" if BATCH_FIELD in entity else "is not in grid:"
        ck.fail("search.batch_size", f"fit bisects the grid's batch sizes, but {BATCH_FIELD} {where}; give "
                                     f"grid.{BATCH_FIELD} two or more values, or remove search.batch_size", node,
                "batch_size")
    if method is not None:
        others = math.prod(len(v) for k, v in grid.items() if not (batch == "fit" and k == BATCH_FIELD))
        if others < 2:
            ck.fail("search.method", f"{method} chooses among several points, but the grid has one "
                                     f"{'shape' if batch == 'fit' else 'point'}; add values to grid: or remove "
                                     "search.method", node, "method")
    if batch is None and method is None:
        ck.fail("search", "asks for nothing: set batch_size: fit, method: halving, or both", doc, "search")
    return SearchSpec(metric, sense, batch, method, int(eta), tuple(more))


def planned_repeats(spec: SearchSpec, grid: Mapping[str, list[Any]], repeats: int) -> int:
    """The repeats a search sweep plans per point: one per rung, then the campaign's *repeats*, then
    :data:`SPARE_REPEATS` (a third run of a point whose runs disagree)."""
    return spec.rungs(shapes(spec, grid)) + 1 + repeats + SPARE_REPEATS


def shapes(spec: SearchSpec, grid: Mapping[str, list[Any]]) -> int:
    """How many shapes (points without ``batch_size: fit``) the grid has: the halving's rungs count from these."""
    return math.prod(len(v) for k, v in grid.items() if not (spec.batch_size and k == BATCH_FIELD))


# -- what the search sees --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """A valid grid point as the search sees it: its entity and harness.spec.memory's prediction (or None)."""

    point_id: str
    entity: Mapping[str, Any]
    total_bytes: float | None = None  # predicted per device
    device_bytes: float | None = None
    predicted_oom: bool | None = None

    @property
    def batch(self) -> int:
        return int(self.entity.get(BATCH_FIELD) or 0)

    def shape(self, fit: bool) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, repr(v)) for k, v in self.entity.items() if not (fit and k == BATCH_FIELD)))

    @property
    def wide_oom(self) -> bool:
        return bool(self.predicted_oom and self.total_bytes and self.device_bytes
                    and self.total_bytes > WIDE_MARGIN * self.device_bytes)

    def prediction(self) -> str:
        if self.total_bytes is None or self.device_bytes is None:
            return "no memory prediction"
        verb = ">" if self.predicted_oom else "<="
        return f"predicted {self.total_bytes / 1e9:.3g} GB {verb} {self.device_bytes / 1e9:.3g} GB"


@dataclass(frozen=True)
class RunSeen:
    """One repeat of a point as the database has it (its last attempt): outcome None while queued or running."""

    repeat: int
    outcome: str | None  # ok | invalid | failed | None
    value: float | None = None  # the goal's column
    rel_ci: float | None = None  # the precision auto-stop's relative half-width (None: not recorded)
    reason: str | None = None
    busy: bool = False  # measured on a host busy with other work (measurements.host_busy)
    values: Mapping[str, float | None] = field(default_factory=dict)  # every objective's column (a Pareto search)

    def of(self, metric: str | None) -> float | None:
        """The run's value of *metric* (None: the goal's first column)."""
        return self.value if metric is None else self.values.get(metric, None)

    @property
    def span(self) -> tuple[float, float] | None:
        """The run's own interval of the goal (None: no value, or no half-width to draw it from)."""
        if self.value is None or self.rel_ci is None:
            return None
        half = abs(self.value) * self.rel_ci
        return self.value - half, self.value + half


@dataclass(frozen=True)
class SearchDecision:
    """What the search decided about one point, and why."""

    point_id: str
    phase: str  # fit | halving | final
    action: str  # run | skipped | stopped | waiting | kept
    reason: str
    repeat: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ShapeFit:
    """One shape's largest fitting batch and its evidence (None while the bisection goes on)."""

    shape: dict[str, Any]
    batch_size: int | None
    largest_ok: int | None
    smallest_oom: int | None
    decided: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SearchState:
    """Where the search stands: the (point_id, repeat) runs to start now, each point's decision, each shape's
    fit, the best point with its interval, and whether the search is over (nothing to run or waited for)."""

    todo: list[tuple[str, int]] = field(default_factory=list)
    decisions: dict[str, SearchDecision] = field(default_factory=dict)
    fits: list[ShapeFit] = field(default_factory=list)
    best: str | None = None
    best_interval: Interval | None = None
    runners_up: list[str] = field(default_factory=list)
    pareto: list[str] = field(default_factory=list)  # a Pareto search's front: no point better on every objective
    stuck: list[str] = field(default_factory=list)  # points whose failed run waits for sbench retry
    waiting: bool = False
    # (point_id, repeat) -> the share of the campaign's run length that run gets (a rung's short run; 1: full)
    scale: dict[tuple[str, int], float] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return not self.todo and not self.waiting


def short_run_steps(steps: int, scale: float) -> int:
    """How many of a point's *steps* (its max_steps) a short run of *scale* of the run length trains: that share,
    rounded up, at least :data:`MIN_STEPS` (harness.campaign.search runs it as ``runner.max_run_steps``)."""
    return max(MIN_STEPS, math.ceil(steps * scale))


def spread_rel_ci(step_time_cv: float | None, steps: int | None) -> float | None:
    """A run's relative 95 % half-width from its own steps when the precision auto-stop recorded none (another
    stop method, or a short run stopped before its window): about 2 x the step times' CV / sqrt(steps); None
    with fewer than two steps timed."""
    if step_time_cv is None or not steps or steps < 2:
        return None
    return 2.0 * step_time_cv / math.sqrt(steps)


def used_runs(runs: Sequence[RunSeen]) -> tuple[list[RunSeen], int]:
    """The ok runs with a value the search decides on, and how many it left out: a run measured on a busy host
    (``RunSeen.busy``) is left out where the point has a run on a quiet one; where every run was busy, all are
    used (and :func:`host_note` says so)."""
    ok = [r for r in runs if r.outcome == "ok" and r.value is not None]
    quiet = [r for r in ok if not r.busy]
    return (quiet, len(ok) - len(quiet)) if quiet else (ok, 0)


def host_note(runs: Sequence[RunSeen]) -> str:
    """What a decision says of busy-host runs: those left out, or that every run it rests on was one."""
    used, left = used_runs(runs)
    if left:
        return f"; {left} run(s) on a busy host left out"
    if used and all(r.busy for r in used):
        return f"; its {len(used)} run(s) all on a busy host: used, as nothing else measured it"
    return ""


def interval(runs: Sequence[RunSeen], metric: str | None = None) -> Interval | None:
    """The mean of the goal values (*metric*: that objective's) of the runs the search uses (:func:`used_runs`) ±
    their half-widths combined (independent runs: root sum of squares over n; a run's relative half-width is its
    step time's, for every objective); None without an ok run with a value."""
    vals = [(v, r.rel_ci or 0.0) for r in used_runs(runs)[0] if (v := r.of(metric)) is not None]
    if not vals:
        return None
    n = len(vals)
    mean = sum(v for v, _ in vals) / n
    half = math.sqrt(sum((v * h) ** 2 for v, h in vals)) / n
    return Interval(mean, half, n)


def disagreement(runs: Sequence[RunSeen]) -> str | None:
    """Two of the runs the search uses whose own intervals lie apart (each run's value ± its half-width), said as
    text; None where every pair overlaps (or a run has no half-width to tell)."""
    spans = [(r.repeat, sp) for r in used_runs(runs)[0] if (sp := r.span) is not None]
    for i, (ra, a) in enumerate(spans):
        for rb, b in spans[i + 1:]:
            if a[1] < b[0] or b[1] < a[0]:
                return (f"repeat {ra} [{a[0]:,.4g}, {a[1]:,.4g}] and repeat {rb} [{b[0]:,.4g}, {b[1]:,.4g}] "
                        "lie apart")
    return None


def needs_third(runs: Sequence[RunSeen]) -> str | None:
    """Why a point needs one more run before it is cut or ranked: two runs that disagree and fewer than
    :data:`AGREE_RUNS` used (None: it needs none)."""
    if len(used_runs(runs)[0]) >= AGREE_RUNS:
        return None
    return disagreement(runs)


def _run(runs: Mapping[str, Sequence[RunSeen]], pid: str, repeat: int) -> RunSeen | None:
    return next((r for r in runs.get(pid, ()) if r.repeat == repeat), None)


def _fits(c: Candidate, runs: Mapping[str, Sequence[RunSeen]]) -> str | None:
    """ok | oom | failed | waiting | None (never run) from a point's repeat-0 run (the bisection's run)."""
    r = _run(runs, c.point_id, 0)
    if r is None:
        return None
    if r.outcome is None:
        return "waiting"
    return {"ok": "ok", "invalid": "oom"}.get(r.outcome, "failed")


def _bisect(shape: list[Candidate], runs: Mapping[str, Sequence[RunSeen]], st: SearchState,
            fit: bool, scale: float, scan: bool = False) -> Candidate | None:
    """Bisect one shape (candidates by ascending batch), or with *scan* run every open batch at once (a packed
    sweep: they run in ascending order in one pack); its largest fitting point, or None (none fits, or undecided:
    ``st`` says which)."""
    seen = [_fits(c, runs) for c in shape]
    ok = [i for i, s in enumerate(seen) if s == "ok"]
    lo = max(ok) if ok else None
    oom = [i for i, s in enumerate(seen) if s == "oom" and (lo is None or i > lo)]
    hi = min(oom) if oom else len(shape)
    inside = list(range(-1 if lo is None else lo, hi))[1:]
    wide = [i for i in inside if shape[i].wide_oom]
    eff_hi = hi
    if wide and not (lo is None and len(wide) == len(inside)):
        eff_hi = min(wide)
    elif wide:  # nothing known to fit and every candidate predicted far over: the smallest must be tried
        eff_hi = min(wide) + 1
    open_ = list(range(-1 if lo is None else lo, eff_hi))[1:]
    pending = [i for i in open_ if seen[i] in ("waiting", "failed")]
    untried = [i for i in open_ if seen[i] is None]
    decided = not pending and not untried
    for i, c in enumerate(shape):
        pid, s = c.point_id, seen[i]
        if s is not None:
            st.scale[(pid, 0)] = scale
        if s == "ok" and i == lo:
            st.decisions[pid] = SearchDecision(pid, FIT, KEEP, f"largest batch that fits so far: batch {c.batch} "
                                                               f"ran ok ({c.prediction()})", 0)
        elif s == "ok":
            st.decisions[pid] = SearchDecision(pid, FIT, STOP, f"ran ok, below batch {shape[lo].batch} that also fits "
                                                         f"({c.prediction()})" if lo is not None else "ran ok", 0)
        elif s == "oom":
            st.decisions[pid] = SearchDecision(pid, FIT, STOP, f"OOM at batch {c.batch} (invalid run; "
                                                               f"{c.prediction()})", 0)
        elif s == "waiting":
            st.decisions[pid] = SearchDecision(pid, FIT, WAIT, f"bisection run of batch {c.batch} queued or running", 0)
            st.waiting = True
        elif s == "failed" and i >= hi:  # (a run its pack did not start after a smaller batch's OOM)
            st.decisions[pid] = SearchDecision(pid, FIT, SKIP, f"bounded above by batch {shape[hi].batch} OOM "
                                                               f"(its own run did not end ok: not needed)", 0)
        elif s == "failed":
            reason = _run(runs, pid, 0)
            st.decisions[pid] = SearchDecision(pid, FIT, WAIT, "bisection run failed "
                                                               f"({reason.reason if reason else '?'}); sbench retry "
                                                               "runs it again", 0)
            st.stuck.append(pid)
        elif i >= hi:
            st.decisions[pid] = SearchDecision(pid, FIT, SKIP, f"bounded above by batch {shape[hi].batch} OOM "
                                                         f"({c.prediction()})")
        elif i >= eff_hi:
            st.decisions[pid] = SearchDecision(pid, FIT, SKIP, "predicted OOM (" + c.prediction().removeprefix(
                "predicted ") + f", over {WIDE_MARGIN:g}x): not run")
        elif lo is not None and i < lo:
            st.decisions[pid] = SearchDecision(pid, FIT, SKIP, f"bounded below by batch {shape[lo].batch} ok: a "
                                                               "smaller batch of the shape is not run")
    if not pending and untried:
        low = f"batch {shape[lo].batch} ok" if lo is not None else "nothing known to fit"
        high = f"batch {shape[hi].batch} OOM" if hi < len(shape) else "no OOM seen"
        if scan:
            # every open batch at once, in ascending order in one pack: the largest that fits in one wave, and each
            # batch below it measured (a batch after one that runs out of memory is not started)
            batches = ", ".join(str(shape[i].batch) for i in untried)
            probes = [(i, f"scan: {low}, {high}; batches {batches} in ascending order in one pack; this run: batch "
                          f"{shape[i].batch}") for i in untried]
        else:
            if not ok and not any(s == "oom" for s in seen) and any(c.total_bytes is not None for c in shape):
                # the first run of the shape: the largest batch predicted to fit
                fitting = [i for i in untried if shape[i].predicted_oom is False]
                probe = fitting[-1] if fitting else untried[len(untried) // 2]
            else:
                probe = untried[len(untried) // 2]
            probes = [(probe, f"bisection: {low}, {high}; runs batch {shape[probe].batch}")]
        for i, why in probes:
            c = shape[i]
            st.todo.append((c.point_id, 0))
            st.scale[(c.point_id, 0)] = scale
            st.decisions[c.point_id] = SearchDecision(c.point_id, FIT, RUN,
                                                      f"{why} ({c.prediction()}){_share(scale)}", 0)
    for i in untried:
        if shape[i].point_id not in st.decisions:
            st.decisions[shape[i].point_id] = SearchDecision(shape[i].point_id, FIT, WAIT, "not decided yet: the "
                                                                                     "bisection goes on")
    shape_fields = {k: v for k, v in shape[0].entity.items() if not (fit and k == BATCH_FIELD)}
    st.fits.append(ShapeFit(shape_fields, shape[lo].batch if decided and lo is not None else None,
                            shape[lo].batch if lo is not None else None,
                            shape[hi].batch if hi < len(shape) else None, decided))
    return shape[lo] if decided and lo is not None else None


def step(spec: SearchSpec, candidates: Sequence[Candidate], runs: Mapping[str, Sequence[RunSeen]],
         repeats: int) -> SearchState:
    """The search's next runs and every point's decision, from *runs* (point id -> its repeats as the database has
    them); *repeats* is the campaign's repeats for the best point and its runners-up."""
    st = SearchState()
    fit = spec.batch_size == "fit"
    entrants: list[Candidate] = []
    if fit:
        shapes: dict[tuple[tuple[str, str], ...], list[Candidate]] = {}
        for c in candidates:
            shapes.setdefault(c.shape(True), []).append(c)
        rungs = spec.rungs(len(shapes))
        # a bisection's run is a first rung's: as short as the halving's first rung over every shape
        scale = float(spec.eta) ** -rungs
        for shape in shapes.values():
            best = _bisect(sorted(shape, key=lambda c: c.batch), runs, st, True, scale, spec.scan)
            if best is not None:
                entrants.append(best)
        if st.todo or st.waiting or st.stuck or any(not f.decided for f in st.fits):
            return st
        # Every other point the bisection measured enters too (its run is its rung 0): a smaller batch can be the
        # faster one, and the answer is the best point the search measured, not only the best largest batch.
        entrants += [c for c in candidates if c not in entrants and _fits(c, runs) == "ok"]
    else:
        entrants = list(candidates)
        rungs = spec.rungs(len(entrants))
    if not entrants:
        return st
    _halve(spec, entrants, runs, repeats, st, rungs)
    return st


def _halve(spec: SearchSpec, entrants: list[Candidate], runs: Mapping[str, Sequence[RunSeen]], repeats: int,
           st: SearchState, rungs: int) -> None:
    alive = list(entrants)
    rung = 0
    upto: dict[str, list[RunSeen]] = {}
    drawn: dict[str, dict[str, Interval | None]] = {}  # the objectives' intervals over upto, per point
    while True:
        blocked = False
        share = float(spec.eta) ** -(rungs - rung)
        for c in list(alive):
            r = _run(runs, c.point_id, rung)
            phase = HALVING if rungs else FINAL
            st.scale.setdefault((c.point_id, rung), share)  # (a bisection's run keeps its own)
            if r is None:
                st.todo.append((c.point_id, rung))
                st.decisions[c.point_id] = SearchDecision(c.point_id, phase, RUN, f"rung {rung} run{_share(share)}",
                                                          rung)
                blocked = True
            elif r.outcome is None:
                st.decisions[c.point_id] = SearchDecision(c.point_id, phase, WAIT, f"rung {rung} run queued or running",
                                                    rung)
                st.waiting = blocked = True
            elif r.outcome == "failed":
                st.decisions[c.point_id] = SearchDecision(c.point_id, phase, WAIT, f"rung {rung} run failed "
                                                    f"({r.reason or 'see its job dir'}); sbench retry runs it again",
                                                    rung)
                st.stuck.append(c.point_id)
                blocked = True
            elif r.outcome != "ok" or r.value is None:
                st.decisions[c.point_id] = SearchDecision(c.point_id, phase, STOP, f"rung {rung} run ended {r.outcome} "
                                                    f"with no {spec.metric}", rung)
                alive.remove(c)
        if blocked or not alive:
            _leader(st, spec, alive, runs, rung)
            return
        upto = {c.point_id: [x for x in runs.get(c.point_id, ()) if x.repeat <= rung] for c in alive}
        seen = {pid: interval(rs) for pid, rs in upto.items()}
        ranked = sorted(alive, key=lambda c: seen[c.point_id].mean,  # type: ignore[union-attr]
                        reverse=spec.sense == "maximize")
        # A leader whose own runs disagree cuts no one yet: its next run says where it stands.
        unsure = needs_third(upto[ranked[0].point_id])
        drawn = {}
        if rung >= rungs or len(alive) == 1:
            break
        kept: list[Candidate] = []
        for c in ranked:
            why = None if unsure or needs_third(upto[c.point_id]) else _outclassed(spec, c, ranked, upto, drawn)
            if why is not None:
                st.decisions[c.point_id] = SearchDecision(c.point_id, HALVING, STOP, f"halved out at rung {rung}: "
                                                          f"{why}{host_note(upto[c.point_id])}", rung)
            else:
                kept.append(c)
        alive = kept
        if len(alive) == 1:  # the one left needs no longer look to be told from the others: its repeats are next
            break
        rung += 1
    best = ranked[0]
    # The best, the runners-up whose intervals overlap it, and any point whose runs disagree: the campaign's repeats
    final = [best] + [c for c in ranked[1:] if unsure or needs_third(upto[c.point_id])
                      or _outclassed(spec, c, ranked, upto, drawn) is None]
    for c in ranked[1:]:
        if c not in final and c in alive:  # (those halved out earlier keep their reason)
            st.decisions[c.point_id] = SearchDecision(c.point_id, HALVING, STOP, f"out at the last rung {rung}: "
                                                f"{_outclassed(spec, c, ranked, upto, drawn)}"
                                                f"{host_note(upto[c.point_id])}", rung)
    waiting = False
    for c in final:
        odd = needs_third(upto[c.point_id])
        role = ("best" if c is best else f"kept, as its runs disagree ({odd})" if odd
                else "kept, as the best's runs disagree" if _outclassed(spec, c, ranked, upto, drawn) is not None
                else "on the front (no point is better on every objective beyond the intervals)" if spec.pareto
                else "runner-up (its interval overlaps the best's)")
        todo: list[int] = []
        mine = runs.get(c.point_id, ())
        spare = rung + 1 + repeats
        # every repeat ended and two runs still disagree: one run more (the spare) before it is ranked
        split = needs_third([r for r in mine if r.repeat < spare])
        third = f"; two of its runs disagree ({split}): a third, repeat {spare}" if split else ""
        wait = False
        for rep in range(rung + 1, spare + 1):
            st.scale[(c.point_id, rep)] = 1.0
            r = _run(runs, c.point_id, rep)
            if rep == spare and (todo or wait or c.point_id in st.stuck or not (split or r is not None)):
                break
            if r is None:
                todo.append(rep)
            elif r.outcome is None:
                wait = True
            elif r.outcome == "failed":
                st.stuck.append(c.point_id)
        waiting = waiting or wait
        st.todo += [(c.point_id, rep) for rep in todo]
        st.decisions[c.point_id] = SearchDecision(
            c.point_id, FINAL, RUN if todo else (WAIT if wait else KEEP),
            f"{role} after rung {rung}: the campaign's {repeats} repeat(s)"
            + (f" {', '.join(map(str, todo))} submitted" if todo else "") + (third if split else "")
            + ("; failed repeat(s): sbench retry runs them again" if c.point_id in st.stuck else "")
            + host_note(mine), rung + 1)
    st.waiting = st.waiting or waiting
    # The answer: every ok run of the final points (rungs and repeats), the best by its mean.
    final_iv = {c.point_id: interval(runs.get(c.point_id, ())) for c in final}
    answer = sorted((c for c in final if final_iv[c.point_id] is not None),
                    key=lambda c: final_iv[c.point_id].mean,  # type: ignore[union-attr]
                    reverse=spec.sense == "maximize")
    if answer:
        st.best, st.best_interval = answer[0].point_id, final_iv[answer[0].point_id]
        st.runners_up = [c.point_id for c in answer[1:]]
        if spec.pareto:  # the front, on every run of the final points
            every = {c.point_id: list(runs.get(c.point_id, ())) for c in answer}
            st.pareto = [c.point_id for c in answer if _outclassed(spec, c, answer, every) is None]


def _share(scale: float) -> str:
    return "" if scale >= 1 else f", {scale:.2g} of the campaign's run length"


def _leader(st: SearchState, spec: SearchSpec, alive: Sequence[Candidate], runs: Mapping[str, Sequence[RunSeen]],
            rung: int) -> None:
    """While a rung waits (a run queued, running, or failed until sbench retry runs it again), the point ahead so
    far by its ok runs: sbench best names it, with the search not over or the failed runs it waits on."""
    seen = {c.point_id: interval([x for x in runs.get(c.point_id, ()) if x.repeat <= rung]) for c in alive}
    ahead = sorted((c for c in alive if seen[c.point_id] is not None),
                   key=lambda c: seen[c.point_id].mean,  # type: ignore[union-attr]
                   reverse=spec.sense == "maximize")
    if ahead:
        st.best, st.best_interval = ahead[0].point_id, seen[ahead[0].point_id]


def _beaten(spec: SearchSpec, iv: Interval, best: Interval) -> bool:
    """*iv* lies wholly on the wrong side of *best*: its upper end below the best's lower end (maximize)."""
    return iv.hi < best.lo if spec.sense == "maximize" else iv.lo > best.hi


def ratio_bounds(iv: Interval) -> tuple[float, float]:
    """A Pareto objective's interval as a factor either side of its value: mean / (1 + r) .. mean x (1 + r), r its
    relative half-width. Every goal column is positive and the objectives are ratios of one another (a million
    tokens' cost is the price over the throughput, tokens per joule the throughput over the power): a factor is the
    same on an objective and on its reciprocal, where mean ± half would reach below zero on one of them (a noisy
    short run) and not on the other, and dominance would depend on which of the two the goal names."""
    r = iv.rel
    return (iv.mean / (1.0 + r), iv.mean * (1.0 + r)) if math.isfinite(r) else (-math.inf, math.inf)


def _bounds_text(iv: Interval) -> str:
    lo, hi = ratio_bounds(iv)
    return f"{iv.mean:,.4g} [{lo:,.4g}, {hi:,.4g}]"


def objective_intervals(spec: SearchSpec, runs: Sequence[RunSeen]) -> dict[str, Interval | None]:
    """Each objective's interval over the runs the search uses (:func:`used_runs`): the mean of its values, and a
    relative half-width from the runs' own alone, sqrt(sum of their squares) / n (a run's relative half-width is its
    step time's, the same for every objective), so that an objective and its reciprocal get the same factor
    (:func:`ratio_bounds`); None without an ok run with a value."""
    used = used_runs(runs)[0]
    out: dict[str, Interval | None] = {}
    for m in spec.metrics:
        vals = [(v, r.rel_ci or 0.0) for r in used if (v := r.of(None if m == spec.metric else m)) is not None]
        if not vals:
            out[m] = None
            continue
        n = len(vals)
        mean = sum(v for v, _ in vals) / n
        out[m] = Interval(mean, abs(mean) * math.sqrt(sum(h * h for _, h in vals)) / n, n)
    return out


def _outclassed(spec: SearchSpec, c: Candidate, ranked: Sequence[Candidate], runs: Mapping[str, Sequence[RunSeen]],
                seen: dict[str, dict[str, Interval | None]] | None = None) -> str | None:
    """Why *c* leaves on the evidence of *runs* (each point's runs so far), or None: with one objective, its
    interval lies wholly on the wrong side of the best's (*ranked*'s first); with several (a Pareto search), another
    point is better on every objective beyond both intervals (*seen*: the objectives' intervals already drawn from
    the same *runs*, filled in here). The best is never outclassed."""
    if c is ranked[0]:
        return None
    if not spec.pareto:
        iv, top = interval(runs[c.point_id]), interval(runs[ranked[0].point_id])
        if iv is None or top is None or not _beaten(spec, iv, top):
            return None
        word = "<" if spec.sense == "maximize" else ">"
        return f"{iv.text()} {word} best {top.text()} ({spec.metric})"
    seen = {} if seen is None else seen

    def ivs(pid: str) -> dict[str, Interval | None]:
        if pid not in seen:
            seen[pid] = objective_intervals(spec, runs[pid])
        return seen[pid]

    mine = ivs(c.point_id)
    for o in ranked:
        if o is c:
            continue
        theirs = ivs(o.point_id)
        if all((a := mine[m]) is not None and (b := theirs[m]) is not None
               and (ratio_bounds(b)[0] > ratio_bounds(a)[1] if sense == "maximize"
                    else ratio_bounds(b)[1] < ratio_bounds(a)[0]) for sense, m in spec.objectives):
            return f"dominated by {o.point_id}: " + "; ".join(
                f"{m} {_bounds_text(mine[m])} {'<' if sense == 'maximize' else '>'} "  # type: ignore[arg-type]
                f"{_bounds_text(theirs[m])}" for sense, m in spec.objectives)  # type: ignore[arg-type]
    return None


# -- what a campaign records of its search, and the search's answer ---------------------------------------------
@dataclass(frozen=True)
class RecordedSearch:
    """What a search campaign's campaign line records of its search (and ``campaigns.search_spec`` holds): the spec,
    the grid's fields, the campaign's repeats and the valid points as the search sees them, so that ``sbench best``
    and the report answer from these and the database alone. :meth:`to_dict` writes it; :meth:`from_dict` reads
    it back."""

    spec: SearchSpec
    grid_fields: tuple[str, ...]
    repeats: int
    candidates: tuple[Candidate, ...]

    def to_dict(self) -> dict[str, Any]:
        return {**self.spec.to_dict(), "grid_fields": list(self.grid_fields), "repeats": self.repeats,
                "points": [{"point_id": c.point_id, "entity": dict(c.entity), "total_bytes": c.total_bytes,
                            "device_bytes": c.device_bytes, "predicted_oom": c.predicted_oom}
                           for c in self.candidates]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RecordedSearch:
        """What :meth:`to_dict` wrote (repeats not recorded: 1)."""
        return cls(SearchSpec.from_dict(doc), tuple(doc.get("grid_fields") or ()), int(doc.get("repeats") or 1),
                   tuple(Candidate(str(c["point_id"]), dict(c.get("entity") or {}), c.get("total_bytes"),
                                   c.get("device_bytes"), c.get("predicted_oom")) for c in doc.get("points") or []))


@dataclass(frozen=True)
class SearchEvidence:
    """What the results database holds of a search campaign (``harness.db.search.search_evidence`` reads it): the
    search it recorded, each point's repeats, each ended attempt's seconds (``harness.db.search.run_seconds``), the
    decisions recorded (newest per point) and the recorded entity of each of its points."""

    campaign: str
    recorded: RecordedSearch
    runs: Mapping[str, Sequence[RunSeen]]
    spent: Sequence[Mapping[str, Any]]
    decisions: Sequence[Mapping[str, Any]]
    entities: Mapping[str, Mapping[str, Any]]


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def grid_estimate(cands: Sequence[Candidate], fits: Mapping[str, bool], gpus: Mapping[str, int],
                  spent: Sequence[Mapping[str, Any]], scale: Mapping[tuple[str, int], float],
                  steps: Mapping[str, int] | None = None) -> tuple[dict[str, float], str | None]:
    """What running every grid point once at full length would have taken (``train_s``, ``allocation_s``,
    ``gpu_s``), and from what (None: no run to tell). A point that fits, by the first of: the mean of its own
    full-length ok runs; its own short (rung or scan) runs, stretched: training over the run's share of the run
    length, the allocation its start-up once plus that training; the mean of the campaign's full-length ok runs;
    the campaign's short runs, stretched. A point that does not fit: the mean of its OOM runs, else the
    campaign's. Short and full runs never share a mean. A short run's share is that of the steps it trained where
    the point has a max_steps (*steps*: :func:`short_run_steps` of them), else of the run length. GPU seconds: a
    point's allocation seconds times its *gpus*. The basis names each kind used, with how many points."""
    def stretched(r: Mapping[str, Any], key: str) -> float | None:
        share = scale.get((str(r["point_id"]), int(r["repeat"])), 1.0)
        n = (steps or {}).get(str(r["point_id"])) or 0
        if share < 1.0 and n > 0:
            share = min(1.0, short_run_steps(n, share) / n)
        train, alloc = r.get("train_s"), r.get("allocation_s")
        if share >= 1.0 or r["outcome"] != "ok":
            v = train if key == "train_s" else alloc
            return None if v is None else float(v)
        if train is None:
            return None
        grown = float(train) / share
        return grown if key == "train_s" else None if alloc is None else float(alloc) - float(train) + grown

    # the runs grouped once by (kind, point id; None: the campaign's); kind: full | short | oom
    pools: dict[tuple[str, str | None], list[Mapping[str, Any]]] = {}
    for r in spent:
        if r["outcome"] == "ok":
            kind = "full" if scale.get((str(r["point_id"]), int(r["repeat"])), 1.0) >= 1.0 else "short"
        elif r["outcome"] == "invalid":
            kind = "oom"
        else:
            continue
        for pid in (str(r["point_id"]), None):
            pools.setdefault((kind, pid), []).append(r)
    words = {("full", True): "own full-length runs", ("short", True): "own short runs, stretched",  # (in this order)
             ("full", False): "the campaign's full-length runs", ("short", False): "the campaign's short runs, "
             "stretched", ("oom", True): "own OOM runs", ("oom", False): "the campaign's OOM runs"}
    out = {"train_s": 0.0, "allocation_s": 0.0, "gpu_s": 0.0}
    used: dict[str, int] = {}
    for c in cands:
        order = [("full", c.point_id), ("short", c.point_id), ("full", None), ("short", None)] \
            if fits[c.point_id] else [("oom", c.point_id), ("oom", None)]
        pick = next((k for k in order if pools.get(k)), None)
        if pick is None:
            continue
        label = words[(pick[0], pick[1] is not None)]
        used[label] = used.get(label, 0) + 1
        for key in ("train_s", "allocation_s"):
            v = _mean([x for r in pools[pick] if (x := stretched(r, key)) is not None]) or 0.0
            out[key] += v
            if key == "allocation_s":
                out["gpu_s"] += v * gpus.get(c.point_id, 1)
    basis = ", ".join(f"{label} ({used[label]} point{'s' if used[label] != 1 else ''})"
                      for label in words.values() if label in used) or None
    return out, basis


def answer(ev: SearchEvidence) -> dict[str, Any]:
    """What a search campaign found (``sbench best`` and the report's section say it alike): the best point with its
    goal value and interval (and whether busy-host runs were left out of it, or all it has), the largest batch that
    fits per shape with its evidence, the decisions recorded, and what the campaign spent beside the full grid's
    estimate (:func:`grid_estimate`)."""
    spec, grid_fields, cands = ev.recorded.spec, list(ev.recorded.grid_fields), list(ev.recorded.candidates)
    state = step(spec, cands, ev.runs, ev.recorded.repeats)
    entity = {c.point_id: c.entity for c in cands}
    iv = state.best_interval
    limit = {tuple(sorted((k, repr(v)) for k, v in f.shape.items() if k != BATCH_FIELD)): f for f in state.fits}

    def fits(c: Candidate) -> bool:
        f = limit.get(tuple(sorted((k, repr(c.entity.get(k))) for k in grid_fields if k != BATCH_FIELD)))
        if f is None:  # no batch_size: fit: every valid point runs
            return True
        return f.batch_size is not None and c.batch <= f.batch_size

    gpus = {c.point_id: int((ev.entities.get(c.point_id) or c.entity).get("number_gpus") or 1) for c in cands}
    steps = {c.point_id: int((ev.entities.get(c.point_id) or c.entity).get("max_steps") or 0) for c in cands}
    estimate, basis = grid_estimate(cands, {c.point_id: fits(c) for c in cands}, gpus, ev.spent, state.scale, steps)
    best_entity = dict(ev.entities.get(state.best) or {}) if state.best else {}
    used, left = used_runs(ev.runs.get(state.best or "", ()))
    return {
        "campaign": ev.campaign, "goal": spec.goal(),
        "objectives": [{"sense": sense, "metric": m} for sense, m in spec.objectives],
        "done": state.done, "stuck": state.stuck,
        # the points whose next run the sweep's budget: stopped (harness.campaign.submit), with why
        "stopped_at_budget": {str(d["point_id"]): str(d["reason"]) for d in ev.decisions
                              if str(d.get("reason") or "").startswith(BUDGET_STOP) and not state.done},
        "best": None if state.best is None or iv is None else {
            "point_id": state.best, **{k: entity[state.best].get(k) for k in grid_fields}, "value": iv.mean,
            "interval": [iv.lo, iv.hi], "runs": iv.n, "entity": best_entity,
            "busy_runs_left_out": left, "busy_host_only": bool(used) and all(r.busy for r in used)},
        "runners_up": state.runners_up,
        # a Pareto search's front: each point with every objective's value and interval (none with one objective)
        "pareto": [{"point_id": pid, **{k: entity[pid].get(k) for k in grid_fields},
                    "objectives": {m: None if iv_m is None else {"value": iv_m.mean,
                                                                 "interval": list(ratio_bounds(iv_m)), "runs": iv_m.n}
                                   for m, iv_m in objective_intervals(spec, ev.runs.get(pid, ())).items()}}
                   for pid in state.pareto],
        "max_batch_size": [{"shape": {k: v for k, v in f.shape.items() if k != BATCH_FIELD},
                            "batch_size": f.batch_size, "largest_ok": f.largest_ok, "smallest_oom": f.smallest_oom,
                            "decided": f.decided} for f in state.fits],
        "runs": len(ev.spent), "grid_points": len(cands),
        "train_s": sum(float(r["train_s"] or 0) for r in ev.spent),
        "allocation_s": sum(float(r["allocation_s"] or 0) for r in ev.spent),
        "gpu_s": sum(float(r["allocation_s"] or 0) * int(r["number_gpus"] or 1) for r in ev.spent),
        "grid_train_s_estimate": estimate["train_s"], "grid_allocation_s_estimate": estimate["allocation_s"],
        "grid_gpu_s_estimate": estimate["gpu_s"], "grid_estimate_from": basis,
        "decisions": [{k: (str(v) if k == "decided_at" and v is not None else v) for k, v in d.items()}
                      for d in ev.decisions],
    }
