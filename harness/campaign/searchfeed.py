"""The feeder job of a search campaign (``search:``, harness.spec.search): one turn submits what the submit quota held
back (``harness.campaign.executors.feed``), then, once nothing is held, collects what ended and submits the search's
next runs (the bisection's, the next rung's, the best point's repeats: ``harness.campaign.submit.more_repeats``),
and submits the next turn ``$SBENCH_FEED_INTERVAL`` seconds later while the search is open. So a search submitted
with one ``sbench submit`` finishes with no further command; ``sbench cancel`` ends the feeding, and ``submit`` or
``retry`` starts it again, from what the database holds.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.campaign.executors import feed
from harness.contract.errors import SbenchError
from harness.slurm.client import Slurm

from .refresh import campaign_history
from .submit import more_repeats


def turn(campaign_dir: Path) -> str:
    """One turn; what it did, in a line for the feeder job's log."""
    doc = feed.feed(campaign_dir)
    if not doc or doc.get("cancelled_at") or not doc.get("search_db"):
        return "nothing to do (no feed, a cancelled one, or no search)"
    if any(g.get("held") for g in doc.get("groups") or []) or doc.get("feeder_job"):
        return "attempts are still held back, or another turn is queued: it goes on with the search"
    db = Path(str(doc["search_db"]))
    # what ended since the last turn, into the database (incremental: the runs that may have moved)
    campaign_history(db, campaign_dir.parent, campaign_dir.name, [], Slurm())
    rep = more_repeats(campaign_dir.name, campaign_dir.parent, db)
    open_ = rep is not None and (bool(rep.submitted) or not rep.search.get("done", True))
    feed.keep_feeding(campaign_dir, open_)
    sent = len(rep.submitted) if rep else 0
    return f"search: {sent} run(s) submitted; " + ("goes on next turn" if open_ else "over (or waits for retry)")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m harness.campaign.searchfeed CAMPAIGN_DIR\n")
        return 2
    try:
        print(f"sbench feed: {turn(Path(argv[0]))}")
    except SbenchError as exc:
        sys.stderr.write(f"sbench feed: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":  # the feeder job of a search
    sys.exit(main(sys.argv[1:]))
