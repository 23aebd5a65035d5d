"""Cancel before the first claim, end to end: an order taken in (its rows written, its
nudge queued) that no scheduler has claimed yet is cancelled, and ends Compensated with
nothing sent to any remote service.

The claim is held back the way an operator would in Azure: the app setting
``AzureWebJobs.<function>.Disabled`` = ``true`` switches off every scheduler function
(``core.names.schedule_functions``), which the local host honours as Azure's does
(tools/funchost/README.md). A first host runs with them off: it takes the order in and
serves the cancel. It is then stopped and a host with them on is started, as a changed
app setting restarts the app in Azure; its scheduler finds the cancel on the row before
any line was claimed. The memtable twin is tests/unit/test_cancel.py's
``test_cancel_before_the_first_claim_ends_compensated_with_nothing_sent``.
"""

from __future__ import annotations

import requests

from core import names
from core.models import LineState, ProcessState
from core.workflow import Kind
from devtools.orders import order_json
from tests.e2e.conftest import wait_until

ORDER = "cb-1"
#: Every scheduler function off: nothing claims a line.
HELD = {f"AzureWebJobs.{function}.Disabled": "true" for function in names.schedule_functions()}


def test_cancel_before_the_first_claim_ends_compensated_and_calls_no_remote(stack, reply_queue):
    (holding,) = stack.start_hosts(API_AUTH="none", **HELD)
    for function in names.schedule_functions():
        assert f"Function {function} is disabled" in holding.log_text()
    stack.send([(ORDER, order_json(ORDER))], reply_to=reply_queue)

    # Taken in: the rows are written and the order waits, Pending, for a first claim.
    state = wait_until(lambda: stack.state(ORDER), timeout=60, what=f"{ORDER}'s rows")
    assert (state.process_state, state.attempt, state.step) == (ProcessState.PENDING, 0, "reserve")
    cancelled = requests.post(
        f"{holding.http_url}/api/orders/{ORDER}/cancel", json={"reason": "changed my mind"}, timeout=30
    )
    assert cancelled.status_code == 202, cancelled.text
    assert cancelled.json()["cancel"]["reason"] == "changed my mind"
    # Still unclaimed when the scheduler comes back: the cancel is decided before any claim.
    state = stack.state(ORDER)
    assert (state.process_state, state.attempt) == (ProcessState.PENDING, 0) and state.cancel_requested_at
    assert all(holding.invocations(function) == [] for function in names.schedule_functions())
    assert holding.terminate() == 0

    stack.start_hosts(API_AUTH="none")  # the scheduler functions on again (an app restart in Azure)
    final = stack.wait_closed([ORDER], timeout=60)[ORDER]
    assert final.process_state is ProcessState.COMPENSATED
    assert final.cause.startswith("cancelled by") and "changed my mind" in final.cause
    assert final.last_error == final.cause
    # No line ran: the first action's row says it was cancelled before it ran, and no undo row.
    lines = stack.lines(ORDER)
    assert {key: line.state for key, line in lines.items()} == {("reserve", Kind.ACTION.value): LineState.CANCELLED}
    assert stack.claims(ORDER) == []
    # No call at any remote service, for this order or any other.
    effects = stack.assert_remote_clean()
    assert effects["calls"] == 0 and all(service["lookups"] == 0 for service in effects["services"].values())
    assert ORDER not in effects["traceparents"] and ORDER not in effects["by_order"]
    # The submitter heard of the cancel and of the end, and of no step processing.
    assert stack.events(reply_queue) == [("received", None), ("cancelling", "reserve"), ("compensated", None)]
