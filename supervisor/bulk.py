"""The operator's resubmit of every order of one cause of Error (a group, core/search.py).

It runs in the caller's request (``POST /api/errors/{group}/resubmit``, or ``ordersctl
resubmit --group``), bounded: at most ``batch`` orders per call, at most ``per_second``
of them per second; a call that stops before the group's end answers with a
``continuation`` (the last order id it handled), and the caller calls again with it.
Each order is the single resubmit (:func:`supervisor.supervision.resubmit`: one If-Match
write on its state row), so:

- two operators resubmitting one group at once resubmit each order once: the second
  write meets the first's ETag and is refused (the order is counted ``skipped``);
- a host that dies mid-group loses nothing: every order is either resubmitted (Pending,
  back in the active index, nudged) or still in Error with its row in the group, and a
  row left behind for an order already resubmitted is skipped and removed on the next call;
- an order is resubmitted only for the Error its row records (same attempt): one that
  failed again since has a new row, and is resubmitted by a later call, not twice by one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from adapters import search
from adapters.messaging import Nudger
from core.models import ProcessState
from core.search import cause_of
from supervisor.supervision import NotResubmittable, resubmit

log = logging.getLogger(__name__)

#: A call's pacing ends within this long, whatever the settings: an HTTP-triggered function
#: must answer within 230 s, the Azure load balancer's idle timeout ("Function app timeout
#: duration", https://learn.microsoft.com/azure/azure-functions/functions-scale#timeout,
#: read 2026-11-25), and a client's own timeout is often shorter.
MAX_CALL_SECONDS = 60


@dataclass
class Progress:
    """What one call did (the JSON of ``POST /api/errors/{group}/resubmit``)."""

    group: str
    #: Orders written back to Pending by this call.
    resubmitted: list[str] = field(default_factory=list)
    #: Rows whose order was no longer in Error at that attempt (resubmitted by someone else,
    #: or failed again since with a row of its own): skipped, their row removed.
    skipped: list[str] = field(default_factory=list)
    #: The last order id handled when the call stopped before the group's end; None: done.
    continuation: str | None = None

    def document(self) -> dict:
        return {
            "group": self.group, "resubmitted": len(self.resubmitted), "skipped": len(self.skipped),
            "orders": self.resubmitted, "done": self.continuation is None, "continuation": self.continuation,
        }


def resubmit_group(
    group: str, *, store, nudger: Nudger, pending_timeout: timedelta, per_second: float, batch: int,
    after: str | None = None, now: Callable[[], datetime], sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Progress:
    """Resubmit the group's orders after ``after`` (order-id order), at most ``batch`` of
    them (and no more than :data:`MAX_CALL_SECONDS` of pacing), paced at ``per_second``
    (each handled row takes a slot)."""
    progress = Progress(group)
    batch = max(1, min(batch, int(per_second * MAX_CALL_SECONDS)))
    rows, more = search.members(store, group, limit=batch, after=after)
    started = clock()
    for n, row in enumerate(rows):
        wait = started + n / per_second - clock()
        if wait > 0:
            sleep(wait)
        _one(row, group, progress, store=store, nudger=nudger, now=now(), pending_timeout=pending_timeout)
    if more and rows:
        progress.continuation = rows[-1].order_id
    log.info("group %s: %d resubmitted, %d skipped%s", group, len(progress.resubmitted), len(progress.skipped),
             f", continues after {progress.continuation}" if progress.continuation else "")
    return progress


def _one(row: search.Member, group: str, progress: Progress, *, store, nudger: Nudger, now: datetime,
         pending_timeout: timedelta) -> None:
    try:
        state = store.get(row.order_id)
    except LookupError:  # the order is gone (retention): its row goes too
        row.remove()
        progress.skipped.append(row.order_id)
        return
    def recorded(state) -> bool:  # the Error this row records
        return (state.process_state is ProcessState.ERROR and state.attempt == row.attempt
                and cause_of(state).group == group)

    if not recorded(state):
        # Not the Error this row records: resubmitted already (a crash before its row went),
        # or failed again since (its new row is in its cause's group).
        if state.process_state is not ProcessState.ERROR or cause_of(state).group != group:
            row.remove()
        progress.skipped.append(row.order_id)
        return
    try:
        # Checked again on the resubmit's own read: another operator's resubmit, and a new
        # Error of another cause, may come between.
        resubmit(row.order_id, store=store, nudger=nudger, now=now, pending_timeout=pending_timeout, expected=recorded)
    except NotResubmittable:  # another operator's resubmit won the If-Match write, or it failed again since
        progress.skipped.append(row.order_id)
        return
    progress.resubmitted.append(row.order_id)
