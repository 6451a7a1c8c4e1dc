"""Campaigns larger than the cluster's limits, from one ``sbench submit``.

**Arrays that fit.** A resource shape's points go into as many arrays as ``MaxArraySize`` needs
(:mod:`harness.slurm.limits`). With ``max_parallel`` the limit holds for the whole shape: each array of the
shape starts after the one before it ended (``afterany``), so at most *max_parallel* of its tasks run.

**Waves within the submit quota.** Submit puts into the queue what the user's submit limit
(``MaxSubmitJobs`` and its kin; each array task counts) leaves room for, keeping one job's room for a
feeder job, and holds the rest back (:mod:`harness.slurm.held`: ``CampaignPaths.feed``, each held job dir's
``submitted.json`` says ``held_back_at``). The feeder job (:func:`harness.build.sbatch.feed_sbatch`, one
core on the sweep's partition or ``slurm.feed_partition``) runs this module: it takes the campaign's lock,
submits the next wave that fits, records it (``submitted.json``, an attempt line per task in the
manifest), and submits itself again to start ``$SBENCH_FEED_INTERVAL`` seconds later while anything is
held. Nothing on the login node has to stay alive. A limit sbench could not read is learnt from sbatch's
refusal: the array is halved and tried again, and what still does not fit waits for the next wave.

``sbench cancel`` stops the feeding first (under the same lock: no wave starts after it), then the arrays.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
from pathlib import Path
from typing import Any

from harness.build.jobspec import JobSpec
from harness.build.sbatch import array_name, array_script, array_shape, feed_sbatch, job_name_of, requeue_command
from harness.campaign.lock import CampaignLocks, holding_campaign_locks
from harness.contract import envvars, jobstate, safefile
from harness.contract.errors import SbenchError, SubmitError
from harness.contract.paths import CampaignPaths, JobPaths
from harness.contract.records import (
    AttemptExtra,
    PackInfo,
    SubmittedInfo,
    append_manifest,
    attempt_line,
    now_iso,
    pack_extra,
    pack_info,
    write_submitted,
)
from harness.slurm.client import SbatchRefused, Slurm
from harness.slurm.held import feeding_stopped, held_count, read_feed, write_feed
from harness.slurm.limits import SubmitLimits, refusal_kind
from harness.spec.inventory import Inventory
from harness.spec.sweep import Sweep

from . import pack
from .base import SubmitOptions, Submitted
from .pack import in_process, pack_time

MAX_FAILED_TURNS = 10


def interval_s() -> int:
    try:
        return max(1, int(float(envvars.FEED_INTERVAL.get())))
    except ValueError:
        return int(envvars.FEED_INTERVAL.default)


def _begin(seconds: int) -> str:
    """sbatch's ``--begin`` for *seconds* from now, as a local time (every SLURM release reads it)."""
    return (_dt.datetime.now() + _dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")


def _entry(s: JobSpec, opts: SubmitOptions) -> dict[str, Any]:
    return {"job_dir": s.job_dir, "point_id": s.point_id, "repeat": s.repeat, "attempt": s.attempt,
            "reason": opts.reasons.get(s.job_dir)}


def new_groups(campaign: str, by_shape: list[list[JobSpec]], opts: SubmitOptions,
               packs: list[list[JobSpec]] | None = None) -> list[dict[str, Any]]:
    """One feed group per resource shape: its array options and its job dirs, in submission order. *packs*
    (``slurm.pack``): one group per resource shape and pack size, each held entry a pack (its first job dir,
    and ``pack``: every point's entry, in the order they run), its time limit the pack's."""
    groups = [{"name": array_name(campaign, specs[0]), "shape": array_shape(specs[0]),
               "max_parallel": opts.max_parallel, "after": opts.dependency, "hold": opts.hold, "last_array": None,
               "single": len(specs) == 1, "held": [_entry(s, opts) for s in specs]}
              for specs in by_shape]
    by_size: dict[tuple[Any, ...], dict[str, Any]] = {}
    for members in packs or []:
        shape = array_shape(members[0])
        ptime = pack_time(members, opts.pack_time_limit)
        if ptime:
            shape["time"] = ptime
        key = (members[0].shape(), len(members), ptime)
        g = by_size.setdefault(key, {"name": f"{array_name(campaign, members[0])}.pack{len(members)}",
                                     "shape": shape, "max_parallel": opts.max_parallel, "after": opts.dependency,
                                     "hold": opts.hold, "last_array": None, "single": False,
                                     "requeue": opts.requeue_command, "in_process": in_process(members[0]),
                                     "held": []})
        g["held"].append({**_entry(members[0], opts), "pack": [_entry(s, opts) for s in members]})
    return groups + list(by_size.values())


def members(held: dict[str, Any]) -> list[dict[str, Any]]:
    """The points a held entry stands for: the points of a pack, else itself."""
    return list(held.get("pack") or [held])


def _pack_of(held: dict[str, Any], index: int) -> PackInfo | None:
    """A pack's record in each of its points' ``submitted.json`` (none for an entry that is no pack)."""
    ms = held.get("pack")
    return pack_info([m["job_dir"] for m in ms], index) if ms else None


def submit_groups(slurm: Slurm, campaign_dir: Path, campaign: str, groups: list[dict[str, Any]],
                  limits: SubmitLimits, budget: int | None) -> tuple[list[tuple[dict[str, Any], str, Any]], str | None]:
    """Submit the groups' held job dirs in arrays of at most ``limits.max_array_size`` tasks, *budget* tasks in
    all (None: no limit known), taking each array's job dirs off its group. Returns, for each task submitted,
    (its held entry, its job id, its array job id and task index), and why submitting stopped short, if it
    did: a limit's refusal, or any other (``sbatch failed: …``). Never raises once anything was submitted:
    what was submitted must be recorded."""
    out: list[tuple[dict[str, Any], str, Any]] = []
    size = limits.max_array_size
    logs = CampaignPaths(campaign_dir).slurm
    logs.mkdir(parents=True, exist_ok=True)
    stopped: str | None = None
    for g in groups:
        while g["held"] and (budget is None or budget > 0):
            n = min(len(g["held"]), size, budget if budget is not None else len(g["held"]))
            chunk = g["held"][:n]
            whole = g.get("single") and n == 1 and len(g["held"]) == 1 and g.get("last_array") is None
            name = g["name"]
            if whole:  # a shape of one point: its own job.sbatch, as rendered
                script = safefile.read_bytes(JobPaths(chunk[0]["job_dir"]).sbatch, campaign_dir,
                                             safefile.SMALL_MAX).decode()
                name = job_name_of(script) or name
            else:
                script = array_script(campaign, g["name"], g["shape"],
                                      [[m["job_dir"] for m in h["pack"]] if h.get("pack") else h["job_dir"]
                                       for h in chunk], g.get("max_parallel"), logs, g.get("requeue"),
                                      bool(g.get("in_process")))
            after_any = g.get("last_array") if g.get("max_parallel") else None
            try:
                job_id = slurm.sbatch(script, CampaignPaths(campaign_dir).submissions, hold=bool(g.get("hold")),
                                      after=g.get("after"), after_any=after_any)
            except SubmitError as exc:
                kind = exc.kind if isinstance(exc, SbatchRefused) else None
                if kind is None:
                    return out, str(exc)
                if n > 1 and kind in ("quota", "array"):
                    # a limit sbench could not read: arrays half as large from now on (a quota is full once
                    # even one task is refused)
                    size = max(1, n // 2)
                    continue
                stopped = str(exc)
                return out, stopped
            for h in chunk:  # the name tells this job's accounting from another's that had its id
                h["job_name"] = name
            if whole:
                out.append((chunk[0], job_id, None))
            else:
                out.extend((h, f"{job_id}_{i}", (job_id, i)) for i, h in enumerate(chunk))
            g["last_array"] = job_id
            g["held"] = g["held"][n:]
            if budget is not None:
                budget -= n
    return out, stopped


def record_submitted(done: list[tuple[dict[str, Any], str, Any]], stamp: str, fed: bool) -> None:
    for held, job_id, arr in done:
        for k, m in enumerate(members(held)):
            info = SubmittedInfo(executor="slurm", job_id=job_id, array_job_id=arr[0] if arr else None,
                                 array_task_id=arr[1] if arr else None, submitted_at=stamp,
                                 job_name=held.get("job_name"))
            if fed:
                info["fed_at"] = stamp
            if (pack := _pack_of(held, k)) is not None:
                info["pack"] = pack
            write_submitted(m["job_dir"], info)


def hold_back(groups: list[dict[str, Any]], stamp: str) -> None:
    """Each job dir still held: no job id, and when sbench held it back."""
    for g in groups:
        for h in g["held"]:
            for m in members(h):
                write_submitted(m["job_dir"], SubmittedInfo(executor="slurm", job_id=None, held_back_at=stamp))


def budget_for(limits: SubmitLimits, total: int) -> int | None:
    """Tasks this submission may put in the queue: all of them when the quota (if any is known) takes them
    all; otherwise the room left, less one job's room for the feeder job that submits the rest."""
    if limits.free is None or limits.free >= total:
        return None
    return max(0, limits.free - 1)


def submit_feeder(slurm: Slurm, campaign_dir: Path, doc: dict[str, Any], delay_s: int) -> str:
    """Submit the campaign's feeder script to start *delay_s* seconds from now; its job id."""
    camp = CampaignPaths(campaign_dir)
    script = safefile.read_bytes(camp.feed_script, campaign_dir, safefile.SMALL_MAX).decode()
    return slurm.sbatch(script, camp.submissions, begin=_begin(delay_s))


def start(slurm: Slurm, campaign_dir: Path, campaign: str, specs: list[JobSpec], by_shape: list[list[JobSpec]],
          opts: SubmitOptions, packs: list[list[JobSpec]] | None = None) -> tuple[list[Submitted], int]:
    """Submit *specs* (grouped *by_shape*) as the cluster's limits allow and hold back the rest for a feeder
    job; returns what was handed over (the held ones with no job id, ``extra['held_back']``) and the number
    of sbatch calls. Refused when the rest cannot be held back (no feeder script)."""
    by_spec = {s.job_dir: s for s in specs}
    groups = new_groups(campaign, by_shape, opts, packs)
    limits = slurm.submit_limits({opts.qos} if opts.qos else None)
    stamp = now_iso()
    done, stopped = submit_groups(slurm, campaign_dir, campaign, groups, limits,
                                  budget_for(limits, sum(len(g["held"]) for g in groups)))
    if stopped and not done and refusal_kind(stopped) is None:
        raise SubmitError(stopped)  # sbatch refuses this campaign outright: nothing was submitted
    record_submitted(done, stamp, fed=False)
    calls = len({arr[0] if arr else jid for _h, jid, arr in done})
    out = [Submitted(spec=by_spec[m["job_dir"]], job_id=jid, array_job_id=arr[0] if arr else None,
                     array_task_id=arr[1] if arr else None, extra=_extra(h, k, stamp))
           for h, jid, arr in done for k, m in enumerate(members(h))]
    held = [m for g in groups for h in g["held"] for m in members(h)]
    if not held and not (opts.search_db and opts.feeder_script):
        return out, calls
    if held and not opts.feeder_script:
        raise SubmitError(f"{len(held)} attempt(s) do not fit the submit quota ({limits.describe()}) and no "
                          "feeder job can be made for them")
    hold_back(groups, stamp)
    camp = CampaignPaths(campaign_dir)
    camp.slurm.mkdir(parents=True, exist_ok=True)
    camp.feed_script.write_text(opts.feeder_script or "")  # (set: a held attempt or a search needs it)
    prior = read_feed(campaign_dir)
    # Attempts an earlier feed still holds stay in it while it feeds; a feeding that stopped left them
    # NOT_STARTED (harness.slurm.held), and retry runs them as new attempts: they are not taken back.
    alive = bool(prior) and feeding_stopped(prior, slurm) is None
    doc: dict[str, Any] = {"campaign": campaign,
                           "groups": [g for g in prior.get("groups") or [] if g.get("held") and alive]
                           + [g for g in groups if g["held"]],
                           "interval_s": interval_s(), "cancelled_at": None, "stopped": None,
                           "feeder_job": prior.get("feeder_job") if alive else None,
                           "waves": (prior.get("waves") or []) + [_wave(stamp, done, held, limits, stopped)]}
    if opts.search_db:  # the feeder goes on with the search, held attempts or not (harness.campaign.searchfeed)
        doc["search_db"] = opts.search_db
    write_feed(campaign_dir, doc)
    ensure_feeder(slurm, campaign_dir, doc)
    out += [Submitted(spec=by_spec[h["job_dir"]], job_id=None, extra=AttemptExtra(held_back=True)) for h in held]
    return out, calls


def _extra(held: dict[str, Any], index: int, stamp: str) -> AttemptExtra:
    """What an attempt line of the manifest adds for a task submitted: its job's name, when, and its pack."""
    extra = AttemptExtra(job_name=held.get("job_name"), submitted_at=stamp)
    ms = held.get("pack")
    if ms:
        extra.update(pack_extra([m["job_dir"] for m in ms], index))
    return extra


def _wave(stamp: str, done: list[tuple[dict[str, Any], str, Any]], held: list[dict[str, Any]],
          limits: SubmitLimits, stopped: str | None) -> dict[str, Any]:
    arrays = sorted({arr[0] if arr else jid for _h, jid, arr in done})
    return {"at": stamp, "arrays": arrays, "submitted": len(done), "held": len(held), "limits": limits.describe(),
            **({"refused": stopped} if stopped else {})}


def ensure_feeder(slurm: Slurm, campaign_dir: Path, doc: dict[str, Any]) -> None:
    """Submit a feeder job unless one of this feed is queued or running; a refusal is recorded as why the
    feeding stopped (``sbench submit`` again starts it)."""
    feeder = doc.get("feeder_job")
    if feeder:
        state = slurm.states([str(feeder)]).get(str(feeder))
        if state is not None and not jobstate.is_done(state):
            return
    try:
        doc["feeder_job"] = submit_feeder(slurm, campaign_dir, doc, int(doc.get("interval_s") or interval_s()))
        doc["stopped"] = None
    except SubmitError as exc:
        doc["feeder_job"] = None
        doc["stopped"] = f"the feeder job was not submitted: {exc}"
    write_feed(campaign_dir, doc)


@holding_campaign_locks("feed")
def feed(locks: CampaignLocks, campaign_dir: Path, slurm: Slurm | None = None) -> dict[str, Any]:
    """One turn of the feeder: submit the next wave that fits, then the next turn while anything is held.
    Returns the feed as it left it."""
    slurm = slurm or Slurm()
    campaign_dir = Path(campaign_dir)
    locks.acquire(campaign_dir, "feed", wait_s=max(60.0, float(envvars.CAMPAIGN_WAIT.default)))
    doc = read_feed(campaign_dir)
    me = os.environ.get("SLURM_JOB_ID")
    if not doc or doc.get("cancelled_at"):
        return doc
    if me and doc.get("feeder_job") and str(doc["feeder_job"]) != me:
        return doc  # another feeder took over (a later submit started one): this one leaves it be
    groups = [g for g in doc.get("groups") or [] if g.get("held")]
    for g in groups:  # the preparation job the first wave waited for: done by now, or failed
        if g.get("after"):
            state = slurm.states([str(g["after"])]).get(str(g["after"]))
            if state is None or state == "COMPLETED":
                g["after"] = None  # done (or forgotten by the controller): nothing to wait for
            elif jobstate.is_done(state):
                doc["stopped"] = f"the preparation job {g['after']} ended {state}; its arrays were cancelled"
                doc["feeder_job"] = None
                write_feed(campaign_dir, doc)
                return doc
    total = sum(len(g["held"]) for g in groups)
    limits = slurm.submit_limits(None)
    # This feeder counts against the quota while it runs; its successor needs one job's room.
    budget = None if limits.free is None else max(0, limits.free - 1)
    stamp = now_iso()
    done, stopped = submit_groups(slurm, campaign_dir, str(doc.get("campaign")), groups, limits,
                                  None if budget is not None and budget >= total else budget)
    record_submitted(done, stamp, fed=True)
    append_manifest(CampaignPaths(campaign_dir), [
        attempt_line(str(doc.get("campaign")), m["point_id"], m["repeat"], m["attempt"], m["job_dir"], "slurm", jid,
                     stamp, m.get("reason") or "fed", array_job_id=arr[0] if arr else None,
                     array_task_id=arr[1] if arr else None, extra=AttemptExtra(**_extra(h, k, stamp), fed=True))
        for h, jid, arr in done for k, m in enumerate(members(h))])
    held = [m for g in groups for h in g["held"] for m in members(h)]
    doc["groups"] = [g for g in groups if g["held"]]
    doc["waves"] = (doc.get("waves") or []) + [_wave(stamp, done, held, limits, stopped)]
    # a turn that submitted nothing for a reason other than a full quota (sbatch failing: the controller
    # busy or down) is tried again next turn, MAX_FAILED_TURNS times in a row at most
    failing = bool(stopped) and not done and refusal_kind(stopped or "") not in ("quota", "busy")
    doc["failed_turns"] = int(doc.get("failed_turns") or 0) + 1 if failing else 0
    if held and doc["failed_turns"] >= MAX_FAILED_TURNS:
        doc["feeder_job"] = None
        doc["stopped"] = f"{MAX_FAILED_TURNS} turns in a row submitted nothing; the last said: {stopped}"
        write_feed(campaign_dir, doc)
    elif held:
        doc["feeder_job"] = None
        ensure_feeder(slurm, campaign_dir, doc)
    else:
        doc["feeder_job"] = None
        if not doc.get("search_db"):  # a search's feed ends when the search does (keep_feeding)
            doc["finished_at"] = stamp
        write_feed(campaign_dir, doc)
    return doc


@holding_campaign_locks("feed")
def keep_feeding(locks: CampaignLocks, campaign_dir: Path, search_open: bool,
                 slurm: Slurm | None = None) -> dict[str, Any]:
    """After a search's turn (``harness.campaign.searchfeed``): the next turn while the search is open, else the
    feed's end. Nothing is started for a cancelled feed, nor beside a later turn already queued."""
    slurm = slurm or Slurm()
    campaign_dir = Path(campaign_dir)
    locks.acquire(campaign_dir, "feed", wait_s=max(60.0, float(envvars.CAMPAIGN_WAIT.default)))
    doc = read_feed(campaign_dir)
    if not doc or doc.get("cancelled_at"):
        return doc
    if str(doc.get("feeder_job")) == os.environ.get("SLURM_JOB_ID"):
        doc["feeder_job"] = None  # this turn, ending now
    if search_open:
        doc["finished_at"] = None
        ensure_feeder(slurm, campaign_dir, doc)
    elif not doc.get("feeder_job"):
        doc["finished_at"] = now_iso()
        write_feed(campaign_dir, doc)
    return doc


def stop(slurm: Slurm, campaign_dir: Path) -> list[str]:
    """Stop a campaign's feeding (``sbench cancel``; the caller holds the campaign lock): the feed is marked
    cancelled, its feeder job is cancelled, and every held job dir is marked cancelled. Returns those job dirs."""
    doc = read_feed(campaign_dir)
    if not doc or doc.get("cancelled_at"):
        return []
    stamp = now_iso()
    doc["cancelled_at"] = stamp
    held = [m for g in doc.get("groups") or [] for h in g.get("held") or [] for m in members(h)]
    write_feed(campaign_dir, doc)
    if doc.get("feeder_job"):
        try:
            slurm.cancel([str(doc["feeder_job"])])
        except SubmitError:
            pass  # it ended meanwhile; a feeder that runs finds the feed cancelled and submits nothing
    for h in held:
        write_submitted(h["job_dir"], SubmittedInfo(executor="slurm", job_id=None, held_back_at=stamp,
                                                    cancelled_at=stamp))
    return [str(h["job_dir"]) for h in held]


def feed_summary(slurm: Slurm, campaign_dir: Path) -> dict[str, Any]:
    """For ``submit``: the campaign's feed as it stands (what it holds, its feeder job, the limits of its last
    wave, why it stopped, and ``search`` for a search's feeder); {} when it holds nothing and feeds no search."""
    doc = read_feed(campaign_dir)
    if doc.get("cancelled_at") or not held_count(doc) and not (doc.get("search_db") and not doc.get("finished_at")):
        return {}
    waves = doc.get("waves") or []
    why = feeding_stopped(doc, slurm)
    return {"held": held_count(doc), "feeder_job": doc.get("feeder_job") if why is None else None,
            "stopped": why, "limits": waves[-1].get("limits") if waves else None, "waves": len(waves),
            "search": bool(doc.get("search_db"))}


def feed_notes(workdir: Path, campaign: str | None, slurm: Slurm) -> list[str]:
    """For ``status``: a line for each campaign sbench still feeds (how many attempts it holds back, its
    feeder job and that job's state), or whose feeding stopped with attempts held."""
    out = []
    for camp in CampaignPaths.listed(workdir, campaign):
        cdir = camp.root
        doc = read_feed(cdir)
        n = held_count(doc)
        if not n or doc.get("cancelled_at"):
            continue
        why = feeding_stopped(doc, slurm)
        if why is None:
            job = str(doc["feeder_job"])
            state = slurm.states([job]).get(job, "?")
            out.append(f"{cdir.name}: sbench holds {n} attempt(s) back until the submit quota has room; its feeder "
                       f"job {job} ({state}) submits the next wave")
        else:
            out.append(f"{cdir.name}: {n} attempt(s) held back and {why.removeprefix('not submitted: ')}")
    return out


FEEDER = __spec__.name  # this module, as the feeder job runs it (python -m), also when it runs as __main__


def feeder_script(sweep: Sweep, inv: Inventory, campaign_dir: Path, module: str | None = None) -> str:
    """The campaign's feeder job script: this module, with the partition's Python (else the inventory's, else
    this one), on the sweep's ``slurm.feed_partition`` or its partition."""
    part = inv.partition(sweep.partition)
    python = part.python or inv.python or sys.executable
    # the caller may name another feeder: a search's goes on with the search once nothing is held
    module = module or FEEDER
    argv = [python, "-m", module, str(Path(campaign_dir).resolve())]
    return feed_sbatch(sweep, inv, argv, os.getcwd(), CampaignPaths(Path(campaign_dir).resolve()).slurm,
                       sweep.slurm.feed_partition)


def pack_requeue(sweep: Sweep, inv: Inventory, campaign_dir: Path) -> str:
    """The shell function a pack calls after an OOM (``harness.campaign.executors.pack``), with the feeder's Python."""
    part = inv.partition(sweep.partition)
    return requeue_command(inv, sweep, part.python or inv.python or sys.executable, os.getcwd(),
                           Path(campaign_dir).resolve(), pack.__name__)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m harness.campaign.executors.feed CAMPAIGN_DIR\n")
        return 2
    try:
        doc = feed(Path(argv[0]))
    except SbenchError as exc:
        sys.stderr.write(f"sbench feed: {exc}\n")
        return 1
    waves = doc.get("waves") or []
    last = waves[-1] if waves else {}
    print(f"sbench feed: submitted {last.get('submitted', 0)}, still held {last.get('held', 0)}; "
          f"next feeder {doc.get('feeder_job') or 'none'}")
    return 0


if __name__ == "__main__":  # the feeder job
    sys.exit(main(sys.argv[1:]))
