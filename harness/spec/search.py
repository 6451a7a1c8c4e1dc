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

**Fastest configuration** (``method: halving``): the entrants are each shape's largest fitting batch (the smaller
batches of a shape are dominated by it), or every point without ``batch_size: fit``. Rung *r* is the points'
repeat *r*; after each rung a point leaves when its interval (mean ± the precision auto-stop's half-width,
combined over its runs) lies wholly on the wrong side of the best one's (its upper end below the best's lower
end); the others go on to the next rung, a longer look at them (one more run each). After
``ceil(log_eta(entrants))`` rungs the best point and the runners-up whose intervals overlap it get the campaign's
repeats (``repeats: N``), as repeats after the last rung.
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
DEFAULT_ETA = 3
MAX_ETA = 16
BATCH_FIELD = "batch_size"
# A point predicted to need more than this many times its device's memory is not run to learn that it does not
# fit, unless the bisection has nothing else to go on (nothing below it is known to fit).
WIDE_MARGIN = 1.25

# How the reason of a point whose next run the sweep's budget: stopped begins (harness.campaign.submit writes it).
BUDGET_STOP = "stopped at the budget: "
# A decision's phase and action, as the search_decisions table and sbench best say them.
FIT, HALVING, FINAL = "fit", "halving", "final"
PLAN = "plan"  # a point the plan found invalid: none of the search's, recorded with the plan's reasons
RUN, SKIP, STOP, WAIT, KEEP = "run", "skipped", "stopped", "waiting", "kept"


@dataclass(frozen=True)
class SearchSpec:
    """A sweep's ``search:``: the goal (a measurements column and whether more is better), how the batch size is
    chosen and how the fastest point is found."""

    metric: str
    sense: str  # maximize | minimize
    batch_size: str | None = None  # fit | None (batch_size is a grid field like any other)
    method: str | None = None  # halving | None (every entrant gets the campaign's repeats)
    eta: int = DEFAULT_ETA

    def to_dict(self) -> dict[str, Any]:
        return {"goal": {self.sense: self.metric}, "batch_size": self.batch_size, "method": self.method,
                "eta": self.eta}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> SearchSpec:
        """The spec :meth:`to_dict` recorded (an eta not recorded: :data:`DEFAULT_ETA`)."""
        sense, metric = next(iter(doc["goal"].items()))
        return cls(str(metric), str(sense), doc.get("batch_size"), doc.get("method"),
                   int(doc.get("eta") or DEFAULT_ETA))

    def rungs(self, entrants: int) -> int:
        """How many halving rungs *entrants* points go through before the final repeats (0: one point, or no
        halving)."""
        if self.method is None or entrants <= 1:
            return 0
        return max(1, math.ceil(math.log(entrants) / math.log(self.eta) - 1e-9))

    def better(self, a: float, b: float) -> bool:
        return a > b if self.sense == "maximize" else a < b


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
    if len(goal) != 1:
        ck.fail("search.goal", f"must name one of {', '.join(GOAL_SENSES)} with one measurements column, e.g. "
                               "{maximize: dataset_tokens_per_second}", node, "goal")
    sense, metric = next(iter(goal.items()))
    if not isinstance(metric, str) or metric not in METRICS:
        ck.fail(f"search.goal.{sense}", f"must be a numeric measurements column, got {metric!r}; valid: "
                                        f"{', '.join(METRICS)}", goal, sense)
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
    return SearchSpec(str(metric), str(sense), batch, method, int(eta))


def planned_repeats(spec: SearchSpec, grid: Mapping[str, list[Any]], repeats: int) -> int:
    """The repeats a search sweep plans per point: one per rung, then the campaign's *repeats*."""
    entrants = math.prod(len(v) for k, v in grid.items() if not (spec.batch_size and k == BATCH_FIELD))
    return spec.rungs(entrants) + 1 + repeats


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
    stuck: list[str] = field(default_factory=list)  # points whose failed run waits for sbench retry
    waiting: bool = False
    # (point_id, repeat) -> the share of the campaign's run length that run gets (a rung's short run; 1: full)
    scale: dict[tuple[str, int], float] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return not self.todo and not self.waiting


def spread_rel_ci(step_time_cv: float | None, steps: int | None) -> float | None:
    """A run's relative 95 % half-width from its own steps when the precision auto-stop recorded none (another
    stop method, or a short run stopped before its window): about 2 x the step times' CV / sqrt(steps); None
    with fewer than two steps timed."""
    if step_time_cv is None or not steps or steps < 2:
        return None
    return 2.0 * step_time_cv / math.sqrt(steps)


def interval(runs: Sequence[RunSeen]) -> Interval | None:
    """The mean of the ok runs' goal values ± their half-widths combined (independent runs: root sum of squares
    over n); None without an ok run with a value."""
    vals = [(r.value, r.rel_ci or 0.0) for r in runs if r.outcome == "ok" and r.value is not None]
    if not vals:
        return None
    n = len(vals)
    mean = sum(v for v, _ in vals) / n
    half = math.sqrt(sum((v * h) ** 2 for v, h in vals)) / n
    return Interval(mean, half, n)


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
            fit: bool, scale: float) -> Candidate | None:
    """Bisect one shape (candidates by ascending batch); its largest fitting point, or None (none fits, or
    undecided: ``st`` says which)."""
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
        if not ok and not any(s == "oom" for s in seen) and any(c.total_bytes is not None for c in shape):
            # the first run of the shape: the largest batch predicted to fit
            fitting = [i for i in untried if shape[i].predicted_oom is False]
            probe = fitting[-1] if fitting else untried[len(untried) // 2]
        else:
            probe = untried[len(untried) // 2]
        c = shape[probe]
        st.todo.append((c.point_id, 0))
        st.scale[(c.point_id, 0)] = scale
        low = f"batch {shape[lo].batch} ok" if lo is not None else "nothing known to fit"
        high = f"batch {shape[hi].batch} OOM" if hi < len(shape) else "no OOM seen"
        st.decisions[c.point_id] = SearchDecision(c.point_id, FIT, RUN, f"bisection: {low}, {high}; runs batch "
                                                                  f"{c.batch} ({c.prediction()}){_share(scale)}",
                                                     0)
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
        # a bisection's run is a first rung's: as short as the halving's first rung over every shape
        scale = float(spec.eta) ** -spec.rungs(len(shapes))
        for shape in shapes.values():
            best = _bisect(sorted(shape, key=lambda c: c.batch), runs, st, True, scale)
            if best is not None:
                entrants.append(best)
        if st.todo or st.waiting or st.stuck or any(not f.decided for f in st.fits):
            return st
    else:
        entrants = list(candidates)
    if not entrants:
        return st
    _halve(spec, entrants, runs, repeats, st)
    return st


def _halve(spec: SearchSpec, entrants: list[Candidate], runs: Mapping[str, Sequence[RunSeen]], repeats: int,
           st: SearchState) -> None:
    alive = list(entrants)
    rungs = spec.rungs(len(entrants))
    rung = 0
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
        seen = {c.point_id: interval([x for x in runs.get(c.point_id, ()) if x.repeat <= rung]) for c in alive}
        ranked = sorted(alive, key=lambda c: seen[c.point_id].mean,  # type: ignore[union-attr]
                        reverse=spec.sense == "maximize")
        top = seen[ranked[0].point_id]
        assert top is not None
        if rung >= rungs or len(alive) == 1:
            break
        kept: list[Candidate] = []
        for c in ranked:
            iv = seen[c.point_id]
            assert iv is not None
            if c is not ranked[0] and _beaten(spec, iv, top):
                word = "<" if spec.sense == "maximize" else ">"
                st.decisions[c.point_id] = SearchDecision(c.point_id, HALVING, STOP, f"halved out at rung {rung}: "
                                                    f"{iv.text()} {word} best {top.text()} ({spec.metric})", rung)
            else:
                kept.append(c)
        alive = kept
        if len(alive) == 1:  # the one left needs no longer look to be told from the others: its repeats are next
            break
        rung += 1
    best = ranked[0]
    final = [best] + [c for c in ranked[1:] if not _beaten(spec, seen[c.point_id], top)]  # type: ignore[arg-type]
    for c in ranked[1:]:
        if c not in final and c in alive:  # (those halved out earlier keep their reason)
            iv = seen[c.point_id]
            assert iv is not None
            st.decisions[c.point_id] = SearchDecision(c.point_id, HALVING, STOP, f"out at the last rung {rung}: "
                                                f"{iv.text()} does not overlap best {top.text()} ({spec.metric})",
                                                rung)
    waiting = False
    for c in final:
        role = "best" if c is best else "runner-up (its interval overlaps the best's)"
        todo = []
        for rep in range(rung + 1, rung + 1 + repeats):
            st.scale[(c.point_id, rep)] = 1.0
            r = _run(runs, c.point_id, rep)
            if r is None:
                todo.append(rep)
            elif r.outcome is None:
                waiting = True
            elif r.outcome == "failed":
                st.stuck.append(c.point_id)
        st.todo += [(c.point_id, rep) for rep in todo]
        st.decisions[c.point_id] = SearchDecision(
            c.point_id, FINAL, RUN if todo else (WAIT if waiting else KEEP),
            f"{role} after rung {rung}: the campaign's {repeats} repeat(s)"
            + (f" {', '.join(map(str, todo))} submitted" if todo else "")
            + ("; failed repeat(s): sbench retry runs them again" if c.point_id in st.stuck else ""), rung + 1)
    st.waiting = st.waiting or waiting
    # The answer: every ok run of the final points (rungs and repeats), the best by its mean.
    final_iv = {c.point_id: interval(runs.get(c.point_id, ())) for c in final}
    answer = sorted((c for c in final if final_iv[c.point_id] is not None),
                    key=lambda c: final_iv[c.point_id].mean,  # type: ignore[union-attr]
                    reverse=spec.sense == "maximize")
    if answer:
        st.best, st.best_interval = answer[0].point_id, final_iv[answer[0].point_id]
        st.runners_up = [c.point_id for c in answer[1:]]


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
    search it recorded, each point's repeats, the seconds it spent (``harness.db.search.campaign_seconds``), the
    decisions recorded (newest per point) and the recorded entity of each of its points."""

    campaign: str
    recorded: RecordedSearch
    runs: Mapping[str, Sequence[RunSeen]]
    spent: Mapping[str, float]
    decisions: Sequence[Mapping[str, Any]]
    entities: Mapping[str, Mapping[str, Any]]


def answer(ev: SearchEvidence) -> dict[str, Any]:
    """What a search campaign found (``sbench best`` and the report's section say it alike): the best point with its
    goal value and interval, the largest batch that fits per shape with its evidence, the decisions recorded, and
    what the campaign spent beside the full grid's estimate (each valid point once: one at or below its shape's
    largest fitting batch at the mean of the campaign's ok runs, one above it at the mean of its OOM runs)."""
    spec, grid_fields, cands = ev.recorded.spec, list(ev.recorded.grid_fields), list(ev.recorded.candidates)
    state = step(spec, cands, ev.runs, ev.recorded.repeats)
    spent = ev.spent
    entity = {c.point_id: c.entity for c in cands}
    iv = state.best_interval
    limit = {tuple(sorted((k, repr(v)) for k, v in f.shape.items() if k != BATCH_FIELD)): f for f in state.fits}

    def fits(c: Candidate) -> bool:
        f = limit.get(tuple(sorted((k, repr(c.entity.get(k))) for k in grid_fields if k != BATCH_FIELD)))
        if f is None:  # no batch_size: fit: every valid point runs
            return True
        return f.batch_size is not None and c.batch <= f.batch_size

    best_entity = dict(ev.entities.get(state.best) or {}) if state.best else {}
    n_fit = sum(1 for c in cands if fits(c))
    n_oom = len(cands) - n_fit
    return {
        "campaign": ev.campaign, "goal": {spec.sense: spec.metric}, "done": state.done, "stuck": state.stuck,
        # the points whose next run the sweep's budget: stopped (harness.campaign.submit), with why
        "stopped_at_budget": {str(d["point_id"]): str(d["reason"]) for d in ev.decisions
                              if str(d.get("reason") or "").startswith(BUDGET_STOP) and not state.done},
        "best": None if state.best is None or iv is None else {
            "point_id": state.best, **{k: entity[state.best].get(k) for k in grid_fields}, "value": iv.mean,
            "interval": [iv.lo, iv.hi], "runs": iv.n, "entity": best_entity},
        "runners_up": state.runners_up,
        "max_batch_size": [{"shape": {k: v for k, v in f.shape.items() if k != BATCH_FIELD},
                            "batch_size": f.batch_size, "largest_ok": f.largest_ok, "smallest_oom": f.smallest_oom,
                            "decided": f.decided} for f in state.fits],
        "runs": int(spent["runs"]), "grid_points": len(cands), "train_s": spent["train_s"],
        "allocation_s": spent["allocation_s"], "gpu_s": spent["gpu_s"],
        "grid_train_s_estimate": n_fit * spent["ok_train_s"] + n_oom * spent["invalid_train_s"],
        "grid_allocation_s_estimate": n_fit * spent["ok_allocation_s"] + n_oom * spent["invalid_allocation_s"],
        "grid_gpu_s_estimate": n_fit * spent["ok_gpu_s"] + n_oom * spent["invalid_gpu_s"],
        "decisions": [{k: (str(v) if k == "decided_at" and v is not None else v) for k, v in d.items()}
                      for d in ev.decisions],
    }
