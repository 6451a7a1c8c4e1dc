"""Whether a collected campaign has next runs to send: an adaptive campaign's next repeats (``repeats: {min, max,
cv}``, :mod:`harness.campaign.repeats`) or a search's next runs (:mod:`harness.campaign.search`).

:func:`settled` answers from the manifest and the database alone. When nothing is due it says so with the report
a collect prints (the repeats' verdicts, the search's decisions, recorded as they stand); only a campaign with
runs due goes on to the submit path (``harness.campaign.submit.more_repeats``): so a collect that finds nothing to
send starts and ends without the planning, rendering and executors of a submission.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Literal

from harness.contract.paths import DbRef, resolve_db, resolve_workdir
from harness.db.store import store_exists
from harness.spec.sweep import AdaptiveRepeats

from . import manifest
from .decisions import SubmitReport
from .repeats import MORE, point_verdicts
from .search import record_decisions, recorded_state
from .search import summary as search_summary
from .state import read_history


class Due(enum.Enum):
    DUE = "due"


DUE = Due.DUE  # runs are due: the submit path decides and sends them


def settled(campaign: str, workdir: Path | None = None,
            db: DbRef | None = None) -> SubmitReport | None | Literal[Due.DUE]:
    """None: *campaign* is neither adaptive nor a search. A report with nothing submitted: nothing is due now
    (its decisions are recorded as they stand). :data:`DUE`: runs are due."""
    campaign_dir = resolve_workdir(workdir) / campaign
    spec = manifest.adaptive_repeats(campaign_dir)
    recorded = manifest.search_spec(campaign_dir)
    if recorded is not None:
        # a search's next runs: the bisection's, the next rung's, the best point's repeats (harness.spec.search).
        # When it asks for none (runs in flight, over, or waiting for retry), nothing is planned or locked: its
        # decisions are recorded as they stand now.
        dbp = resolve_db(db)
        state = recorded_state(recorded, dbp, campaign)
        if state.todo:
            return DUE
        events = record_decisions(campaign_dir, campaign, state)
        rec = manifest.campaign_record(workdir, campaign)
        return SubmitReport(campaign, str(rec.get("executor") or ""), campaign_dir, [],
                            db_note=manifest.record_events(dbp, events) if events else None,
                            search=search_summary(state))
    if spec is None:
        return None
    # What the database has now (collect just read it): when no point's next repeat is due, nothing is planned,
    # rendered or locked.
    dbp = resolve_db(db)
    if not store_exists(dbp):
        return DUE
    history = read_history(dbp, campaign)
    verdicts = point_verdicts(AdaptiveRepeats(int(spec["min"]), int(spec["max"]), float(spec["cv"])),
                              sorted({p for c, p, _ in history.by_run if c == campaign}), history, campaign)
    if any(v.state == MORE for v in verdicts.values()):
        return DUE
    rec = manifest.campaign_record(workdir, campaign)
    return SubmitReport(campaign, str(rec.get("executor") or ""), campaign_dir, [], repeats=list(verdicts.values()))
