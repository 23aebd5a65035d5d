"""The liveness bound: how long an order can take, from a line's first failure to the
order's terminal state, as a formula of the step policies and the supervisor's and the
breaker's settings. Pure: no I/O, no ``azure.*`` import.

docs/workflows.md ("How long an order can take") states the same formula in words; the
model-based test (tests/unit/test_protocol_model.py) and the end-to-end liveness tests
check orders against it.

One **line** (a step's action, or its compensation) with timeout ``T`` and
``F`` = max failures, under a supervisor that ticks every ``S`` with pending timeout
``P`` and retry backoff ``b(i) = min(cap, base * 2**(i-1))``:

- an attempt claimed at ``t`` is answered, or its deadline passes, by ``t + T``; its
  answer is awaited for the response grace ``G`` after that (RESPONSE_GRACE_SECONDS: it may
  be held up in the app's own queues), and the supervisor sees the miss within ``S``;
- after failure ``i < F`` the line is nudged again after ``b(i)``; had that nudge been
  lost, the supervisor nudges again once ``P`` has passed on top, within ``S``;
- after failure ``F`` the line is handed back to the scheduler at once (give-up), with
  the same ``P + S`` should that nudge be lost.

So a line ends (done, refused, or given up) within::

    L = F * (T + G + 2S + P) + sum(b(i) for i in 1 .. F-1)

From the first failure of any line, the order is terminal within the sum of ``L`` over
the lines that may still run: the current one, the actions after it, and the undos of
every step that has one (each undo a line of its own, with the policy of the step it
undoes). That is :func:`order_bound`.

**An outage.** While the agents' breaker for a service is open, a line at that service
is postponed instead of failing; each postponement waits at most the open time plus
its jitter, ``w = max(O, 1 s) + j*O + P + S`` (``O`` = BREAKER_OPEN_SECONDS, ``j`` the
jitter fraction). Once the service is back, every breaker half-opens within ``O`` and
a trial closes it: the postponement that spans the return ends within ``w``, and a
line can be refused once more in half-open (while the trial is out, or because it has
just failed and gives the trial to a line that waits: agents/breaker.py), told to wait
``max(1 s, ...) + j*O``, within ``w`` again. So an outage of length ``D`` adds at most
``D + 2w`` to each line it holds up (its attempts count against its own ``F`` as ever):
:func:`order_bound` with ``outage=D`` adds ``D + 2w`` per remaining line at the service
that was down (or at every service, when none is named). ``D`` is the time any breaker
for that service is open, whatever opened it (a service failing about half its calls
reopens breakers without being down for everyone: its lines are postponed the same).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from core.lifecycle import backoff
from core.workflow import Kind, StepPolicy, Workflow


@dataclass(frozen=True)
class Timing:
    """The settings the bound depends on, besides each step's own policy."""

    #: How often the supervisor sweeps (SUPERVISOR_SCHEDULE).
    supervisor_interval: timedelta
    #: PENDING_TIMEOUT_SECONDS: a Pending row not claimed by then is nudged again.
    pending_timeout: timedelta
    #: RETRY_BACKOFF_BASE_SECONDS / RETRY_BACKOFF_MAX_SECONDS.
    backoff_base: timedelta
    backoff_cap: timedelta
    #: BREAKER_OPEN_SECONDS and the jitter fraction a postponed line's wait carries.
    breaker_open: timedelta = timedelta(seconds=30)
    breaker_jitter: float = 0.25
    #: RESPONSE_GRACE_SECONDS: how long past an attempt's deadline its answer is awaited.
    response_grace: timedelta = timedelta(0)


def line_bound(policy: StepPolicy, timing: Timing) -> timedelta:
    """The longest one line can take from its first claim to its end (done, refused or
    given up and handed back), with ``policy`` resolved (every field set)."""
    if policy.timeout_seconds is None or policy.max_failures is None:
        raise ValueError("line_bound needs a resolved policy: StepPolicy.over(defaults)")
    failures = policy.max_failures
    attempt = (
        timedelta(seconds=policy.timeout_seconds) + timing.response_grace + 2 * timing.supervisor_interval
        + timing.pending_timeout
    )
    waits = sum((backoff(i, timing.backoff_base, timing.backoff_cap) for i in range(1, failures)), timedelta(0))
    return failures * attempt + waits


def postponement_wait(timing: Timing) -> timedelta:
    """The longest one postponement (breaker open) holds a line: ``w`` above."""
    open_time = max(timing.breaker_open, timedelta(seconds=1))
    return open_time + timing.breaker_jitter * timing.breaker_open + timing.pending_timeout + timing.supervisor_interval


def remaining_lines(workflow: Workflow, step_index: int, kind: Kind) -> list[tuple[int, Kind]]:
    """Every line that may still run once line (step_index, kind) has begun, itself
    first: the actions after it, then the undo of every step up to the last one that
    may have run (in reverse order). A superset of any one path, so a safe bound."""
    lines: list[tuple[int, Kind]] = [(step_index, kind)]
    if kind is Kind.ACTION:
        lines += [(i, Kind.ACTION) for i in range(step_index + 1, len(workflow.steps))]
        last = len(workflow.steps) - 1
    else:
        last = step_index - 1
    lines += [(i, Kind.COMPENSATION) for i in range(last, -1, -1) if workflow.steps[i].compensate is not None]
    return lines


def order_bound(
    workflow: Workflow, defaults: StepPolicy, timing: Timing, *, step_index: int = 0, kind: Kind = Kind.ACTION,
    outage: timedelta = timedelta(0), outage_remote: str | None = None,
) -> timedelta:
    """The longest an order can take, from the first failure of line (step_index, kind)
    to its terminal state; ``outage``: a service (``outage_remote``, or any) that is down
    for everyone that long meanwhile."""
    total = timedelta(0)
    for index, _ in remaining_lines(workflow, step_index, kind):
        step = workflow.steps[index]
        total += line_bound(step.policy_over(defaults), timing)
        if outage > timedelta(0) and outage_remote in (None, step.remote):
            total += outage + 2 * postponement_wait(timing)
    return total


_EVERY_N_SECONDS = re.compile(r"^\*/(\d+) \* \* \* \* \*$")
_EVERY_N_MINUTES = re.compile(r"^0 \*/(\d+) \* \* \* \*$")


def supervisor_interval(schedule: str) -> timedelta:
    """The longest gap between two supervisor ticks for an NCRONTAB schedule of the
    forms ``*/N * * * * *`` (every N seconds) or ``0 */N * * * *`` (every N minutes),
    the ones the docs recommend; any other form raises ValueError, naming them."""
    text = " ".join(schedule.split())
    for pattern, unit in ((_EVERY_N_SECONDS, 1), (_EVERY_N_MINUTES, 60)):
        match = pattern.match(text)
        if match and int(match.group(1)) > 0:
            # */N restarts each minute (hour): the cycle's last gap is N or shorter.
            return timedelta(seconds=int(match.group(1)) * unit)
    raise ValueError(
        f"cannot derive the supervisor's interval from {schedule!r}: use '*/N * * * * *' (seconds) "
        "or '0 */N * * * *' (minutes)"
    )
