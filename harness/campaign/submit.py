"""submit: plan a sweep, decide what still needs running, render it, hand it to an executor, record it."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import __version__
from harness.build.jobspec import JobSpec, request_time
from harness.build.render import Rendered, prepare_points, write_files
from harness.campaign.executors.base import Backend, SubmitOptions
from harness.campaign.executors.registry import get_backend, job_runner, recorded_or
from harness.cluster.faultcheck import check_faults
from harness.cluster.fit import ClusterFit, within_slurms_time
from harness.cluster.preflight import check_devices, check_fabric
from harness.contract.errors import InputError, SubmitError, SweepError
from harness.contract.paths import CampaignPaths, DbRef, DbTarget, resolve_db, resolve_workdir
from harness.contract.records import (
    BudgetLine,
    CampaignLine,
    ManifestLine,
    ReferencesLine,
    RepeatsLine,
    SubmittedInfo,
    append_manifest,
    attempt_line,
    now_iso,
    point_line,
    write_submitted,
)
from harness.data.lengths import length_warnings
from harness.data.prepared import masked_warnings
from harness.data.trainerenv import EnvBuildError, build
from harness.db.predict import predictions
from harness.slurm.client import Slurm
from harness.spec.envs import envs_root, lookup, needed
from harness.spec.inventory import Inventory, load_inventory
from harness.spec.plan import PlannedPoint, counted_warnings, plan_sweep, plan_warnings
from harness.spec.predict import Prediction, beyond_time, over_budget, totals, unseen_by_budget
from harness.spec.search import BUDGET_STOP, HALVING, PLAN, SKIP, STOP, SearchDecision, SearchState
from harness.spec.sweep import AdaptiveRepeats, Sweep, load_sweep

from . import manifest, nextruns
from .decisions import Decision, DecisionKind, SubmitReport
from .lock import CampaignLocks, holding_campaign_locks
from .prepare import run_prepare, work_for
from .refresh import campaign_history
from .repeats import MORE, RepeatsVerdict, point_verdicts
from .search import record_decisions, scaled_sweep, search_state
from .search import recorded as recorded_search
from .search import summary as search_summary
from .state import AttemptState, MeasuredRun, PointHistory, refuse_imported, with_submitted

MORE_REPEATS = "more repeats"  # the reason's head of an adaptive repeat's submission
SEARCH = "search"  # the reason's head of a run a search asked for
NOT_HANDED_OVER = "not started: the submit that rendered it stopped before handing it to the executor"


# A search's feeder job goes on with the search (its turn calls more_repeats here, so it is named, not imported;
# tests/test_search.py checks the name).
SEARCH_FEEDER = f"{__package__}.searchfeed"


def decide(points: list[PlannedPoint], history: PointHistory, campaign: str, force: bool,
           retry_failed: bool, reuse: bool = False, adaptive: AdaptiveRepeats | None = None,
           search: SearchState | None = None) -> list[Decision]:
    """Each point's decision, by its sweep's policy: :func:`search_policy` for a sweep's ``search:``,
    :func:`repeats_policy` for adaptive repeats (``repeats: {min, max, cv}``), else :func:`plain_policy` (a
    sweep has one or neither: ``harness.spec.sweep`` refuses both). A point with no decision is no run of the
    campaign (yet). With *reuse*, a point another campaign measured is not measured again: it takes that run."""
    asked = {pr: search.decisions[pr[0]].reason for pr in search.todo} if search else {}
    verdicts = point_verdicts(adaptive, [p.point_id for p in points if p.valid], history, campaign) \
        if adaptive else {}
    out = []
    for p in points:
        attempts = history.attempts(campaign, p.point_id, p.repeat)
        taken = history.reusable(p.point_id, p.repeat) if reuse else None
        if search is not None:
            key = (p.point_id, p.repeat)
            said = search.decisions.get(p.point_id)
            d = search_policy(p, attempts, asked.get(key), search.scale.get(key, 1.0), force=force,
                              retry_failed=retry_failed, taken=taken,
                              skipped=said.reason if said is not None and said.action == SKIP else None)
        elif adaptive is not None:
            d = repeats_policy(p, attempts, adaptive, verdicts.get(p.point_id), force=force,
                               retry_failed=retry_failed, taken=taken)
        else:
            d = plain_policy(p, attempts, force=force, retry_failed=retry_failed, taken=taken)
        if d is not None:
            out.append(d)
    return out


def plain_policy(p: PlannedPoint, attempts: list[AttemptState], *, force: bool, retry_failed: bool,
                 taken: MeasuredRun | None = None, retry_cancelled: bool = False) -> Decision:
    """One run of a point from its *attempts* in this campaign (oldest first): skip what the campaign measured or
    has in flight; resubmit a failure only when *retry_failed* (one cancelled with ``sbench cancel`` only when
    *retry_cancelled* too); with *taken* (another campaign's run of it, reuse), skip it and say which."""
    if not p.valid:
        return Decision(p, DecisionKind.INVALID, "invalid: " + "; ".join(p.reasons))
    next_attempt = max((a.attempt for a in attempts), default=0) + 1
    inflight = [a for a in attempts if a.outcome is None]
    measured = [a for a in attempts if a.outcome in ("ok", "invalid")]
    if inflight and not force:
        a = inflight[-1]
        job = f"job {a.job_id}" if a.job_id else "no job id yet: its queue has not started it"
        return Decision(p, DecisionKind.IN_FLIGHT, f"attempt {a.attempt} is {a.state or 'in flight'} ({job})")
    if force:
        return Decision(p, DecisionKind.FORCE, "force", next_attempt)
    if measured:
        return Decision(p, DecisionKind.MEASURED, f"already measured in this campaign (attempt "
                                                  f"{measured[-1].attempt} ended {measured[-1].outcome}); use "
                                                  "--force to measure it again")
    if taken is not None:
        return Decision(p, DecisionKind.REUSED, f"reused run {taken.run_id} of campaign {taken.campaign} "
                                                f"({taken.outcome}); measure it here with --force", reused=taken)
    last = attempts[-1] if attempts else None
    if last is not None and last.outcome == "failed" and last.cancelled and not retry_cancelled:
        return Decision(p, DecisionKind.CANCELLED, f"attempt {last.attempt} was cancelled with sbench cancel; use "
                                                   "--force to run it again")
    if last is not None and last.outcome == "failed":
        if retry_failed:
            return Decision(p, DecisionKind.RETRY, "retry", next_attempt)
        return Decision(p, DecisionKind.FAILED, f"attempt {last.attempt} failed ({last.reason or 'see its job dir'}); "
                                                "use --retry-failed")
    return Decision(p, DecisionKind.NEW, "new", next_attempt)


def repeats_policy(p: PlannedPoint, attempts: list[AttemptState], adaptive: AdaptiveRepeats,
                   verdict: RepeatsVerdict | None, *, force: bool, retry_failed: bool,
                   taken: MeasuredRun | None = None) -> Decision | None:
    """Adaptive repeats (``repeats: {min, max, cv}``): a repeat beyond *min* that was never submitted is submitted
    (as attempt 1) only when it is its point's next one and the point's *verdict* asks for it
    (``harness.campaign.repeats``); otherwise it has no decision at all (it is not a run of the campaign until
    then). Every other repeat: :func:`plain_policy`."""
    if p.repeat >= adaptive.min and not attempts:
        if verdict is not None and verdict.state == MORE and verdict.next_repeat == p.repeat:
            return Decision(p, DecisionKind.MORE_REPEATS, f"{MORE_REPEATS}: {verdict.text()}", 1)
        return None
    return plain_policy(p, attempts, force=force, retry_failed=retry_failed, taken=taken)


def search_policy(p: PlannedPoint, attempts: list[AttemptState], asked: str | None, scale: float, *, force: bool,
                  retry_failed: bool, taken: MeasuredRun | None = None, skipped: str | None = None) -> Decision | None:
    """A sweep's ``search:`` (``harness.spec.search``): a run is a run of the campaign only once the search asks
    for it (*asked*: the search's reason; None: it does not ask) or it has attempts (an invalid point's first
    repeat says why it is none). Then :func:`plain_policy`, where retry also goes on with a cancelled run; a new
    run says why the search asks for it, and a submitted one runs *scale* of the sweep's run length. A failed run
    of a point the search skips (*skipped*: why; a batch its scan's pack did not start after its shape's OOM) is
    not retried: the search does not need it."""
    if asked is None and not (attempts or (not p.valid and p.repeat == 0)):
        return None
    if skipped is not None and not force and attempts and attempts[-1].outcome == "failed":
        return Decision(p, DecisionKind.NOT_NEEDED, f"{SEARCH}: not needed ({skipped})")
    d = plain_policy(p, attempts, force=force, retry_failed=retry_failed, taken=taken, retry_cancelled=retry_failed)
    if d.kind is DecisionKind.NEW and asked:
        d = Decision(p, DecisionKind.SEARCH, f"{SEARCH}: {asked}", d.attempt)
    if d.kind.submits:
        d.scale = scale
    return d


def _predicted_oom(memory: dict[str, Any]) -> str:
    return f"predicted OOM: {memory['total_bytes'] / 1e9:.3g} GB > {memory['device_bytes'] / 1e9:.3g} GB per device"


def _recorded_references(campaign_dir: Path) -> list[dict[str, Any]]:
    """The references the manifest holds now: the campaign line's, or the last references line's."""
    refs: list[dict[str, Any]] = []
    for ev in manifest.read(campaign_dir):
        if ev["type"] == "campaign" or ev["type"] == "references":
            if isinstance(ev.get("references"), list):
                refs = ev["references"]
    return refs


def _check_campaign(campaign_dir: Path, sweep: Sweep) -> bool:
    """True when the campaign already exists; refuse reusing a name for another experiment."""
    for ev in manifest.read(campaign_dir):
        if ev["type"] == "campaign":
            if ev.get("experiment") != sweep.experiment.id:
                raise SweepError(f"{sweep.source}: campaign {sweep.campaign!r} already exists for experiment "
                                 f"{ev.get('experiment')}; choose another campaign name")
            return True
    return False


@dataclass(frozen=True)
class SubmitRequest:
    """What one submission asks for: ``sbench submit``'s options, or what ``retry`` and collect's next repeats
    ask of the campaign's own sweep."""

    sweep: Path
    inventory: Path | None = None  # None: $SBENCH_INVENTORY, else the built-in local inventory
    executor: str = "auto"  # auto | local | slurm (harness.campaign.executors.registry)
    workdir: Path | None = None
    db: DbRef | None = None
    model_map: Path | None = None
    campaign: str | None = None  # submit as this campaign (default: the sweep's campaign:)
    force: bool = False  # run points again that this campaign measured
    retry_failed: bool = False  # resubmit points whose last attempt failed
    max_parallel: int | None = None
    hold: bool = False
    preflight: bool = False  # a fabric job per multi-node shape first (check_fabric), and each device measured
    exclude_slow: bool = False  # with preflight: leave a slow device's host out (sbatch --exclude) instead of refusing
    prepare: str = "here"  # here | slurm | no (PREPARE_MODES)
    skip_predicted_oom: bool = False
    reuse_measured: bool = False  # take other campaigns' measured runs (also the sweep's reuse: measured)
    profile: bool = False  # --profile: the last repeat as the sweep's runner.profile says, else steps 3-5 of rank 0


class Mode(enum.Enum):
    """Which command submits, and so which decisions it sends (the internal entry points say it; a
    :class:`SubmitRequest` does not)."""

    SUBMIT = "submit"  # sbench submit: what the request asks
    RETRY = "retry"  # sbench retry: the failed runs again (DecisionKind.RETRY), nothing else
    DUE = "due"  # collect's next runs: what adaptive repeats or a search ask for now, nothing else listed

    @property
    def command(self) -> str:
        """What the campaign lock and a refusal name it (a retry holds the lock as "retry")."""
        return "retry" if self is Mode.RETRY else "submit"


@dataclass
class Planned:
    """A submission's inputs, loaded, planned and rendered in memory before anything is touched."""

    inv: Inventory
    sweep: Sweep
    points: list[PlannedPoint]
    backend: Backend
    fit: ClusterFit
    preview: list[tuple[JobSpec, Rendered]]
    workdir: Path
    db: DbTarget

    @property
    def campaign_dir(self) -> Path:
        return self.workdir / self.sweep.campaign


def submit_sweep(req: SubmitRequest, *, echo: Callable[[str], None] = lambda s: None,
                 slurm: Slurm | None = None) -> SubmitReport:
    """Submit a sweep's points that still need running (see :func:`decide`), as the campaign *req* names
    (default: the sweep's ``campaign:``); ``harness.campaign.wait`` waits for them. From reading what the campaign
    has to recording what was submitted, the campaign's lock is held (``harness.campaign.lock``): a second
    submit, retry or cancel of the campaign waits, so no attempt is started twice."""
    return _submit(req, Mode.SUBMIT, echo=echo, slurm=slurm)


@holding_campaign_locks("submit")
def _submit(locks: CampaignLocks, req: SubmitRequest, mode: Mode, *, echo: Callable[[str], None] = lambda s: None,
            slurm: Slurm | None = None) -> SubmitReport:
    """:func:`submit_sweep`, sending what *mode* sends."""
    # One scheduler client for the whole command: each question to SLURM is asked once.
    slurm = slurm or Slurm()
    plan = _plan(req, mode, echo, slurm)
    refused = plan.fit.refusals([spec for spec, _ in plan.preview])
    if refused:
        raise InputError(f"{plan.sweep.source}: {'; '.join(refused)}; nothing was submitted")
    fit_notes = plan.fit.check([spec for spec, _ in plan.preview], plan.inv)
    checked: list[dict[str, Any]] = []
    devices: list[dict[str, Any]] = []
    slow: list[str] = []
    if req.preflight:
        checked = check_fabric(plan.inv, plan.points, plan.workdir, plan.db, job_runner("slurm", slurm))
        devices, slow = check_devices(plan.inv, plan.points, plan.backend.on_nodes, plan.workdir, plan.db,
                                      req.exclude_slow, slurm)
    if slow:
        plan = _without_hosts(plan, slow)
    sweep, campaign_dir = plan.sweep, plan.campaign_dir
    locks.acquire(campaign_dir, mode.command)
    exists = _check_campaign(campaign_dir, sweep)
    # A campaign measures its own points; it takes other campaigns' measurements only when asked to.
    reuse = req.reuse_measured or sweep.reuse == "measured"
    history, db_note = campaign_history(plan.db, plan.workdir, sweep.campaign, [p.point_id for p in plan.points],
                                        slurm, reuse)
    search = search_state(plan.db, sweep.campaign, sweep.search, plan.points, list(sweep.grid),
                          sweep.search_repeats) if sweep.search else None
    decisions = _decisions(req, mode, plan, history, reuse, search)
    report = SubmitReport(sweep.campaign, plan.backend.name, campaign_dir, decisions, db_note=db_note,
                          warnings=plan_warnings(sweep, plan.inv, plan.points) + fit_notes, preflight=checked,
                          devices=devices, excluded_slow=slow)
    if sweep.adaptive:
        report.repeats = report.repeats_before = list(point_verdicts(
            sweep.adaptive, [p.point_id for p in plan.points if p.valid], history, sweep.campaign).values())
    todo = [d for d in decisions if d.kind.submits]
    preds, spent = predictions(plan.db, [d.point for d in todo], sweep.campaign, plan.inv.cluster)
    report.prediction = {**totals(preds).to_dict(), "spent_gpu_hours": spent[0], "spent_allocation_hours": spent[1],
                         "budget": sweep.budget.to_dict() if sweep.budget else None}
    if sweep.budget is not None:  # before anything is prepared, written or sent
        over = over_budget(sweep.budget, preds, *spent)
        if over and mode is Mode.DUE:  # a running campaign's next runs: it stops there, saying why
            return _stop_at_budget(plan, search, report, over)
        unseen = unseen_by_budget(preds)
        if over:
            raise InputError(f"{sweep.source}: the campaign would pass its budget: {over}"
                             + (f"; {unseen}" if unseen else "")
                             + "; nothing was submitted. Raise budget:, or submit fewer points")
        if unseen:  # a budget that cannot see these runs: said before they go
            report.warnings.append(f"{sweep.source}: {unseen}")
    late = beyond_time(preds, request_time(sweep, plan.inv.partition(sweep.partition)))
    if late:
        report.warnings.append(f"{sweep.source}: {late}")
    dependency = _prepare_before(req, plan, [d.point for d in todo], report, echo)
    report.warnings += length_warnings(sweep, plan.inv, [d.point for d in todo])  # the files prepare just made
    events = append_manifest(CampaignPaths(campaign_dir), _campaign_lines(req, plan, decisions, exists))
    if search is not None:  # every decision of the search, with its reason, before the runs it asks for
        for p in plan.points:  # a point the plan found invalid is none of the search's: it says why
            if not p.valid and p.repeat == 0:
                search.decisions[p.point_id] = SearchDecision(p.point_id, PLAN, SKIP, "invalid: "
                                                              + "; ".join(p.reasons))
        events += record_decisions(campaign_dir, sweep.campaign, search)
        report.search = search_summary(search)
    specs = _write_job_dirs(plan, todo)
    if specs:
        events += _hand_over(req, plan, todo, specs, dependency, report, preds)
        if sweep.adaptive:  # the summary says where the repeats stand now, with these in flight
            now = with_submitted(history, sweep.campaign, [(s.spec.point_id, s.spec.repeat, s.spec.attempt, s.job_id)
                                                           for s in report.submitted])
            report.repeats = list(point_verdicts(sweep.adaptive, [p.point_id for p in plan.points if p.valid], now,
                                                 sweep.campaign).values())
    report.feed = plan.backend.feed_summary(campaign_dir)
    report.db_note = manifest.record_events(plan.db, events) or report.db_note
    return report


def _stop_at_budget(plan: Planned, search: SearchState | None, report: SubmitReport, over: str) -> SubmitReport:
    """A running campaign's next runs (a search's next rung or repeats, the repeats the CV asks for) would pass the
    sweep's ``budget:``: none is sent. Each is reported as over budget, and a search records for each point it
    would have run that it stopped there (``sbench best`` and ``status`` say so); raising the budget and running
    ``sbench submit`` (or the next collect) goes on from the database."""
    why = f"over budget: {over}; raise budget: and run sbench submit again"
    todo = [d for d in report.decisions if d.kind.submits]
    report.decisions = [Decision(d.point, DecisionKind.OVER_BUDGET, why) if d.kind.submits else d
                        for d in report.decisions]
    report.warnings.append(f"{plan.sweep.campaign}: its next {len(todo)} run(s) were not sent: {why}")
    if search is not None:
        for d in todo:
            before = search.decisions.get(d.point.point_id)
            search.decisions[d.point.point_id] = SearchDecision(
                d.point.point_id, before.phase if before else HALVING, STOP, BUDGET_STOP + over, d.point.repeat)
        report.search = search_summary(search)
        report.db_note = manifest.record_events(
            plan.db, record_decisions(plan.campaign_dir, plan.sweep.campaign, search)) or report.db_note
    return report


def _plan(req: SubmitRequest, mode: Mode, echo: Callable[[str], None], slurm: Slurm) -> Planned:
    """Load and plan the sweep, then build and render every valid point in memory: everything that can be wrong
    with the input is found before the database, the manifest or a job dir is touched."""
    inv: Inventory = load_inventory(req.inventory)
    sweep = load_sweep(req.sweep, req.model_map, req.campaign, profile=req.profile)
    # a search starts each shape's bisection at the largest batch predicted to fit (harness.spec.search)
    memory = req.skip_predicted_oom or sweep.search is not None
    points = plan_sweep(sweep, inv, memory=memory)
    check_faults(inv, {p.partition for p in points})
    if req.prepare != "no" and build_trainer_envs(sweep, inv, points, echo):
        # Some rules read the environment (its accelerate, its plugins): decide them on what was built.
        points = plan_sweep(sweep, inv, memory=memory)
    backend = get_backend(req.executor, slurm)
    workdir, db = resolve_workdir(req.workdir), resolve_db(req.db)
    refuse_imported(db, sweep.campaign, mode.command)
    fit = backend.fit(inv, sweep, [p for p in points if p.valid])
    inv = within_slurms_time(inv, sweep, fit)
    preview = prepare_points(sweep, inv, points, workdir / sweep.campaign, exclude=fit.exclude)
    if req.prepare == "no":
        _check_trainer_envs(sweep, inv, points)
    backend.check([spec for spec, _ in preview])
    return Planned(inv, sweep, points, backend, fit, preview, workdir, db)


def _decisions(req: SubmitRequest, mode: Mode, plan: Planned, history: PointHistory, reuse: bool,
               search: SearchState | None = None) -> list[Decision]:
    """:func:`decide`, narrowed to what *mode* sends: only the failed points (retry), only the next runs
    (collect); and no point predicted not to fit (``--skip-predicted-oom``)."""
    sweep = plan.sweep
    decisions = decide(plan.points, history, sweep.campaign, req.force, req.retry_failed or mode is Mode.RETRY,
                       reuse, sweep.adaptive, search)
    refuse_all_invalid(sweep, plan.points)  # after the campaign's own files were read: what is wrong there comes first
    if mode is Mode.RETRY:
        # (a repeat adaptive repeats would add is no failed one: retry leaves it out, unlisted)
        decisions = [d if d.kind is DecisionKind.RETRY or not d.kind.submits
                     else Decision(d.point, DecisionKind.NOT_FAILED, "not failed")
                     for d in decisions if d.kind is not DecisionKind.MORE_REPEATS]
    if mode is Mode.DUE:
        decisions = [d for d in decisions if d.kind in (DecisionKind.MORE_REPEATS, DecisionKind.SEARCH)]
    if req.skip_predicted_oom:
        # An allocation is not spent on a point that will not fit (harness.spec.memory says why, per point).
        decisions = [Decision(d.point, DecisionKind.PREDICTED_OOM, _predicted_oom(d.point.memory))
                     if d.kind.submits and d.point.predicted_oom and d.point.memory else d for d in decisions]
    return decisions


def _campaign_lines(req: SubmitRequest, plan: Planned, decisions: list[Decision], exists: bool) -> list[ManifestLine]:
    """The manifest lines of the campaign before its attempts: the campaign line (or the references and repeats
    that changed since), and a line for each of its points the manifest does not name yet."""
    sweep, campaign_dir, points = plan.sweep, plan.campaign_dir, plan.points
    events: list[ManifestLine] = []
    if not exists:
        events.append(CampaignLine(
            type="campaign", campaign=sweep.campaign, experiment=sweep.experiment.id,
            sweep=str(Path(req.sweep).resolve()),
            # what the sweep's campaign: said (retry follows the sweep only while it still says so)
            sweep_campaign=sweep.campaign if req.campaign is None else load_sweep(req.sweep).campaign,
            inventory=plan.inv.source, cluster=plan.inv.cluster, partition=points[0].partition if points else None,
            partitions={n: plan.inv.partitions[n].public() for n in sorted({p.partition for p in points})
                        if n in plan.inv.partitions},
            executor=plan.backend.name, description=sweep.description, created_at=now_iso(),
            sbench_version=__version__, references=[r.to_dict() for r in sweep.references],
            repeats=sweep.adaptive.to_dict() if sweep.adaptive else None,
            search=None if sweep.search is None else recorded_search(sweep.search, points, list(sweep.grid),
                                                                     sweep.search_repeats),
            budget=sweep.budget.to_dict() if sweep.budget else None))
    else:
        if _recorded_references(campaign_dir) != [r.to_dict() for r in sweep.references]:
            # The sweep's expectations changed (tightened, added): the checks follow the newest word.
            events.append(ReferencesLine(type="references", campaign=sweep.campaign, at=now_iso(),
                                         references=[r.to_dict() for r in sweep.references]))
        if manifest.adaptive_repeats(campaign_dir) != (sweep.adaptive.to_dict() if sweep.adaptive else None):
            # repeats: changed (adaptive now, or other bounds): collect and status follow the newest word
            events.append(RepeatsLine(type="repeats", campaign=sweep.campaign, at=now_iso(),
                                      repeats=sweep.adaptive.to_dict() if sweep.adaptive else None))
        if manifest.budget(campaign_dir) != (sweep.budget.to_dict() if sweep.budget else None):
            # budget: changed (raised, added, removed): the report's spent-against-budget follows the newest word
            events.append(BudgetLine(type="budget", campaign=sweep.campaign, at=now_iso(),
                                     budget=sweep.budget.to_dict() if sweep.budget else None))
    known = {(e.get("point_id"), e.get("repeat")) for e in manifest.read(campaign_dir) if e["type"] == "point"}
    # A repeat adaptive repeats have not asked for is no run of the campaign (yet): status does not list it.
    listed = {(d.point.point_id, d.point.repeat) for d in decisions}
    for p in points:
        if (p.point_id, p.repeat) not in known and (p.point_id, p.repeat) in listed:
            events.append(point_line(sweep.campaign, p.to_dict()))
    return events


def _write_job_dirs(plan: Planned, todo: list[Decision]) -> list[JobSpec]:
    """Write the job dir of each attempt to submit. The preview rendered every valid point as attempt 1: new
    points reuse it; only later attempts (retry, force) are rendered again, under their own job dirs."""
    first = {(spec.point_id, spec.repeat): (spec, files) for spec, files in plan.preview}
    later = [d for d in todo if d.attempt != 1 or d.scale != 1.0]
    again: dict[tuple[str, int], tuple[JobSpec, Rendered]] = {}
    for scale in sorted({d.scale for d in later}):  # a search's short runs: their own runner settings
        group = [d for d in later if d.scale == scale]
        sweep = plan.sweep if scale == 1.0 else scaled_sweep(plan.sweep, scale)
        again.update({(spec.point_id, spec.repeat): (spec, files) for spec, files in prepare_points(
            sweep, plan.inv, [d.point for d in group], plan.campaign_dir,
            {(d.point.point_id, d.point.repeat): d.attempt for d in group}, exclude=plan.fit.exclude)})
    specs: list[JobSpec] = []
    for d in todo:
        spec, files = (first if d.attempt == 1 and d.scale == 1.0 else again)[(d.point.point_id, d.point.repeat)]
        write_files(spec.job_dir, files)
        # Until the backend replaces it: should this submit die (SIGKILL) before handing the job dir over,
        # status, collect and retry see an attempt that never started, not one queued for ever.
        write_submitted(spec.job_dir, SubmittedInfo(executor=plan.backend.name, job_id=None, rendered_at=now_iso(),
                                                     not_started_reason=NOT_HANDED_OVER))
        specs.append(spec)
    return specs


def _hand_over(req: SubmitRequest, plan: Planned, todo: list[Decision], specs: list[JobSpec], dependency: str | None,
               report: SubmitReport, preds: Sequence[Prediction]) -> list[ManifestLine]:
    """Hand the written job dirs to the backend and append an attempt line for each (with its *preds*' prediction);
    returns those lines."""
    sweep, inv, backend = plan.sweep, plan.inv, plan.backend
    opts = backend.complete(SubmitOptions(
        max_parallel=req.max_parallel or sweep.slurm.max_parallel, hold=req.hold, dependency=dependency,
        qos=sweep.slurm.qos or inv.partition(sweep.partition).qos,
        reasons={spec.job_dir: d.reason for d, spec in zip(todo, specs, strict=True)}, pack=sweep.slurm.pack,
        pack_time_limit=plan.fit.within(inv.partition(sweep.partition).time_limit),
        search_db=str(plan.db) if sweep.search else None,
        feeder_module=SEARCH_FEEDER if sweep.search else None), sweep, inv, plan.campaign_dir)
    report.submitted = backend.submit(plan.campaign_dir, specs, opts)
    report.sbatch_calls = backend.sbatch_calls
    report.held_back = sum(1 for s in report.submitted if s.extra.get("held_back"))
    reasons = {(d.point.point_id, d.point.repeat): d.reason for d in todo}
    predicted = {(p.point_id, p.repeat): p.recorded() for p in preds}
    lines: list[ManifestLine] = [attempt_line(
        sweep.campaign, s.spec.point_id, s.spec.repeat, s.spec.attempt, s.spec.job_dir, backend.name, s.job_id,
        now_iso(), reasons[(s.spec.point_id, s.spec.repeat)], array_job_id=s.array_job_id,
        array_task_id=s.array_task_id, extra=s.extra, prediction=predicted.get((s.spec.point_id, s.spec.repeat)))
        for s in report.submitted]
    return append_manifest(CampaignPaths(plan.campaign_dir), lines)


def refuse_all_invalid(sweep: Sweep, points: list[PlannedPoint]) -> None:
    """A sweep none of whose points can run is bad input (exit 2), not a submission of nothing."""
    if not points or any(p.valid for p in points):
        return
    reasons = list(dict.fromkeys(r for p in points for r in p.reasons))
    shown = "; ".join(reasons[:3]) + (f"; ... ({len(reasons)} reasons in all)" if len(reasons) > 3 else "")
    raise SweepError(f"{sweep.source}: every point is invalid ({len({p.point_id for p in points})} point(s)): {shown}; "
                     f"nothing was submitted. Fix the entity or grid (sbench plan {sweep.source} lists each point's "
                     "reasons)")


PREPARE_MODES = ("here", "slurm", "no")


def _prepare_before(req: SubmitRequest, plan: Planned, points: list[PlannedPoint], report: SubmitReport,
                    echo: Callable[[str], None]) -> str | None:
    """Prepare what the points to submit read (``harness.campaign.prepare``); returns an ``afterok`` job id or None.

    ``here`` prepares in this process, unless a preparation job of this campaign (``sbench prepare
    --on slurm``) is still queued or running: then the arrays depend on it. ``slurm`` submits one (the backend
    does, or refuses).
    """
    mode = req.prepare
    if mode not in PREPARE_MODES:
        raise InputError(f"prepare must be one of {', '.join(PREPARE_MODES)}, got {mode!r}")
    if mode == "no" or not points:
        return None
    sweep, inv, backend = plan.sweep, plan.inv, plan.backend
    pending = backend.live_prepare_job(plan.campaign_dir)
    if mode == "here" and pending is None:
        report.prepare = [i.to_dict() for i in run_prepare(work_for(sweep, inv, points), echo)]
        # Now that the training data is prepared, what plan says of it once it is: entries the trainer masks.
        before = {id(p): len(p.warnings) for p in points}
        masked_warnings(sweep, inv, points)
        report.warnings += counted_warnings(w for p in points for w in p.warnings[before[id(p)]:])
        hidden = [i["name"] for i in report.prepare if i["status"] == "not_visible" and i["kind"] == "training_data"]
        if hidden:
            report.warnings.append(
                f"{len(hidden)} training input(s) could not be prepared here (the model is not visible on this "
                "machine), so their jobs will tokenize at start-up; submit with --prepare-on slurm to prepare on a "
                "compute node first")
        return None
    if pending is None:
        pending = backend.prepare_job(sweep, inv, Path(req.sweep), req.inventory, req.model_map, plan.campaign_dir)
        echo(f"prepare: SLURM job {pending}; the arrays start after it succeeds (afterok)")
    else:
        echo(f"prepare: SLURM job {pending} of this campaign is still queued or running; the arrays depend on it")
    report.prepare_job = pending
    return pending


def build_trainer_envs(sweep: Any, inv: Inventory, points: list[PlannedPoint], echo: Callable[[str], None]) -> bool:
    """Build the trainer environments the valid points need and lack, here (the login node reaches the
    package index; compute nodes often do not). Returns whether anything was built."""
    root = envs_root(inv)
    built = False
    for version, extras in sorted(needed(sweep.experiment.method, points).items()):
        if lookup(version, root).lacking(extras):
            echo(f"env      building fms-hf-tuning=={version} in {root} (once; a few minutes)")
            try:
                build(version, root, extras=tuple(sorted(extras)), log=echo)
            except EnvBuildError as exc:
                # Recorded beside the environments: the plan that follows marks its points invalid with it.
                echo(f"env      failed: {exc}")
            built = True
    return built


def _check_trainer_envs(sweep: Any, inv: Inventory, points: list[PlannedPoint]) -> None:
    """Without preparation, a trainer environment nobody built would fail every job that needs it."""
    root = envs_root(inv)
    for version, extras in sorted(needed(sweep.experiment.method, points).items()):
        lacks = lookup(version, root).lacking(extras)
        if lacks:
            raise InputError(f"{sweep.source}: trainer fms-hf-tuning {version}: {', '.join(lacks)} is missing in "
                             f"{root}; build it first (sbench env build fms-hf-tuning=={version}"
                             f"{' --extras fms-accel' if extras else ''}), or submit without --no-prepare")


def _without_hosts(plan: Planned, hosts: list[str]) -> Planned:
    """The plan rendered again with *hosts* excluded from every request; a point that needs more nodes than its
    partition has left is refused (SubmitError)."""
    for p in plan.points:
        left = set(plan.inv.partitions[p.partition].hosts) - set(hosts)
        if p.valid and int(p.entity.get("number_nodes") or 1) > len(left):
            raise SubmitError(f"--exclude-slow: point {p.point_id} needs {p.entity.get('number_nodes')} node(s) of "
                              f"partition {p.partition}, but leaving out {', '.join(hosts)} leaves {len(left)}; "
                              "nothing was submitted")
    exclude = sorted({*(plan.fit.exclude or []), *hosts})
    preview = prepare_points(plan.sweep, plan.inv, plan.points, plan.campaign_dir, exclude=exclude)
    plan.backend.check([spec for spec, _ in preview])
    return dataclasses.replace(plan, fit=dataclasses.replace(plan.fit, exclude=exclude), preview=preview)


def _recorded_sweep(campaign: str, workdir: Path | None, executor: str) -> tuple[Path, Path | None, str]:
    """The sweep, inventory and executor *campaign* was submitted with; refused when that sweep now names
    another campaign."""
    rec = manifest.campaign_record(workdir, campaign)
    inv = rec.get("inventory")
    inv_path = None if not inv or inv.startswith("<") else Path(inv)
    executor = recorded_or(executor, rec.get("executor"))
    # The campaign's own name: the sweep's campaign: key may name another (submit --campaign). What the key
    # said at submission is recorded; a sweep edited since to name another campaign is not followed.
    sweep_path = Path(rec["sweep"])
    named = load_sweep(sweep_path).campaign
    recorded = rec.get("sweep_campaign") or campaign
    if named != recorded:
        raise SweepError(f"{sweep_path}: campaign: is now {named!r}, but campaign {campaign!r} was submitted from "
                         f"this sweep when it said {recorded!r}; nothing was submitted. Set campaign: {recorded} in "
                         f"the sweep again to go on with {campaign!r}, or submit the sweep to run campaign {named!r}")
    return sweep_path, inv_path, executor


def retry_campaign(campaign: str, workdir: Path | None = None, db: DbRef | None = None, *, executor: str = "auto",
                   max_parallel: int | None = None, slurm: Slurm | None = None) -> SubmitReport:
    """Resubmit a campaign's failed points (those that never started included) from the sweep and inventory
    it was submitted with; refused when that sweep now names another campaign."""
    refuse_imported(resolve_db(db), campaign, Mode.RETRY.command)
    sweep_path, inv_path, executor = _recorded_sweep(campaign, workdir, executor)
    return _submit(SubmitRequest(sweep_path, inv_path, executor, workdir, db, campaign=campaign,
                                 max_parallel=max_parallel), Mode.RETRY, slurm=slurm)


def more_repeats(campaign: str, workdir: Path | None = None, db: DbRef | None = None, *,
                 slurm: Slurm | None = None) -> SubmitReport | None:
    """Submit the next repeat of each point of *campaign* whose CV is still above its ``repeats: {min, max,
    cv}`` target (``harness.campaign.repeats``), or a search's next runs, from the sweep and inventory it was
    submitted with; None when the campaign's repeats are not adaptive and it is no search. When nothing is due
    (:func:`harness.campaign.nextruns.settled`), nothing is planned, rendered or locked. ``sbench collect`` calls
    it after collecting."""
    settled = nextruns.settled(campaign, workdir, db)
    if settled is not nextruns.DUE:
        return settled
    return send_due(campaign, workdir, db, slurm=slurm)


def send_due(campaign: str, workdir: Path | None = None, db: DbRef | None = None, *,
             slurm: Slurm | None = None) -> SubmitReport:
    """Submit *campaign*'s next runs that :func:`harness.campaign.nextruns.settled` found due, from the sweep and
    inventory it was submitted with."""
    sweep_path, inv_path, executor = _recorded_sweep(campaign, workdir, "auto")
    return _submit(SubmitRequest(sweep_path, inv_path, executor, workdir, db, campaign=campaign), Mode.DUE,
                   slurm=slurm)
