"""An approval that never comes, end to end: an order of the order-approval workflow, run by
the real function_app.py on a local host, waits for its approval until the deadline the app
setting ``APPROVAL_TIMEOUT_SECONDS`` sets (a few seconds here, a day by default); nobody
approves, so the supervisor's generic expiry gives the wait up and the scheduler releases
the reservation: the order ends Compensated, its cause naming the timeout. An approval sent
afterwards finds no line waiting: 409, nothing changes. The race of an event with the
deadline, to the instant, is tests/unit/test_waiting_steps.py's (over the memtable)."""

from __future__ import annotations

from datetime import datetime, timedelta

import requests

from core.models import LineState, ProcessState, utcnow
from core.workflow import Kind
from devtools.orders import order_json
from tests.servicebus_helpers import bodies, receive

ORDER = "at-1"
#: The wait's deadline: short enough for a test, long enough that the wait is seen waiting.
WAIT_SECONDS = 3
A, C = Kind.ACTION.value, Kind.COMPENSATION.value


def test_an_approval_not_sent_in_time_is_given_up_at_its_deadline_and_the_reservation_released(stack, reply_queue):
    (host,) = stack.start_hosts(API_AUTH="none", APPROVAL_TIMEOUT_SECONDS=str(WAIT_SECONDS))
    submitted = utcnow()
    stack.send([(ORDER, order_json(ORDER, workflow="order-approval"))], reply_to=reply_queue)

    final = stack.wait_closed([ORDER], timeout=60)[ORDER]
    assert final.process_state is ProcessState.COMPENSATED
    assert final.cause.startswith("step approve timed out waiting for approval"), final.cause
    lines = stack.lines(ORDER)
    assert {key: line.state for key, line in lines.items()} == {
        ("reserve", A): LineState.DONE, ("approve", A): LineState.EXHAUSTED, ("reserve", C): LineState.DONE,
    }

    # The submitter was told until when the order waits: its claim plus the setting, and the
    # wait was given up only once that deadline had passed.
    events = bodies(receive(stack.connection_string, reply_queue, stack.waiting(reply_queue), timeout=10))
    assert [(e["status"], e.get("step")) for e in events] == [
        ("received", None), ("processing", "reserve"), ("waiting", "approve"), ("compensating", "reserve"),
        ("compensated", None),
    ]
    (waiting,) = [e for e in events if e["status"] == "waiting"]
    deadline = datetime.fromisoformat(waiting["detail"].rsplit(" until ", 1)[1])
    assert deadline - datetime.fromisoformat(waiting["time"]) == timedelta(seconds=WAIT_SECONDS)
    assert lines[("approve", A)].updated_at >= deadline

    # An approval after the deadline is refused and changes nothing.
    before = stack.record(ORDER)
    late = requests.post(
        f"{host.http_url}/api/orders/{ORDER}/events/approval", json={"approved": True, "by": "ann"}, timeout=30
    )
    assert late.status_code == 409 and late.json()["error"] == "conflict", late.text
    assert stack.record(ORDER) == before

    # At the remotes: reserved once, released once, never charged; nothing applied twice.
    assert stack.applied("inventory").get(ORDER) == ["reserve"]
    assert stack.undone("inventory").get(ORDER) == ["release"]
    assert ORDER not in stack.applied("payments") and ORDER not in stack.applied("shipping")
    stack.assert_remote_clean()
    # Within the liveness bound computed from the hosts' settings, the wait's deadline included.
    stack.assert_within_bound(ORDER, submitted)
