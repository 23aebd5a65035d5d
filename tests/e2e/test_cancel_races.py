"""Cancels racing a step's response and a supervisor reset, end to end on one local stack
(the real function_app.py on a local host, the Service Bus emulator, Azurite, the fake
remote services), every order side by side.

The fake remote holds a step's answer (script ``slow``) and the test watches the call
(``FakeRemote.watch``: an event when it is applied, ``release()`` to let its answer go), so
the cancel is fired at the instant the answer is on its way, with no sleep:

- **racing a step's response** (``reserve``): the cancel recorded while the answer is held,
  then the answer let go (the cancel first); the answer let go, then the cancel fired the
  moment the row shows the response recorded (the response first); and both at once
  (either; measured, the cancel mostly lands first: the API's one write takes a few ms,
  the answer's way through the agent, the responses queue and the scheduler longer).
  Whichever came first, the order ends Compensated with the cause naming the cancel. At
  the last step (``ship``, which has no undo) the same race ends Processed with the cancel
  refused (409), or, the cancel first, in Error with refund and release done.
- **racing a supervisor reset** (``charge`` held past its deadline): the cancel fired when
  the held call ends at its Complete-By, when the row shows the reset, and when the retry's
  attempt is in flight. The step in flight is settled first: nothing is undone before the
  held attempt's Complete-By.

Every time: each applied action undone exactly once, nothing applied twice, no call after
its Complete-By (``Stack.assert_remote_clean``). The interleavings one write at a time are
tests/unit/test_cancel.py's (memtable) and tests/integration/test_cancel_races.py's (Azurite).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from enum import Enum

import requests

from core.models import ProcessState, utcnow
from core.workflow import Kind
from devtools.fake_remote import Watch, WatchedCall
from devtools.orders import order_json
from tests.e2e.conftest import net_zero, wait_until
from tests.e2e.test_compensation import line_states

A, C = Kind.ACTION.value, Kind.COMPENSATION.value
#: A held answer waits this long at most: the test releases it, or its agent leaves at Complete-By.
HELD_SECONDS = 60
#: One attempt's deadline: long enough to cancel while an answer is held, short for the resets.
STEP_TIMEOUT = "8"
#: One call's timeout, over the step's: a held call lasts until its Complete-By.
CALL_TIMEOUT = "12"
#: The wait between a reset and the retry: the cancels fired at the reset land before the retry.
RETRY_BACKOFF = "6"
#: How long the test waits for any one thing the stack does.
WAIT = 60
REASON = "the customer changed their mind"


class Arrival(str, Enum):
    CANCEL_FIRST = "the cancel is recorded while the answer is held, then the answer goes"
    RESPONSE_FIRST = "the answer goes; the cancel is fired when the row shows it recorded"
    SAME_INSTANT = "the answer goes and the cancel is fired at once"


#: Orders whose reserve answer races a cancel.
RESPONSE_RACES = {
    "rr-cancel": Arrival.CANCEL_FIRST,
    "rr-response": Arrival.RESPONSE_FIRST,
    "rr-1": Arrival.SAME_INSTANT,
    "rr-2": Arrival.SAME_INSTANT,
    "rr-3": Arrival.SAME_INSTANT,
}
#: Orders whose last step's answer (ship: no undo) races a cancel.
LAST_STEP_RACES = {
    "rl-cancel": Arrival.CANCEL_FIRST,
    "rl-response": Arrival.RESPONSE_FIRST,
    "rl-1": Arrival.SAME_INSTANT,
}
#: Orders whose charge is held past its deadline: the cancel is fired when that call ends at
#: its Complete-By, when the row shows the supervisor's reset, when the retry is in flight.
AT_DEADLINE, AT_RESET, AT_RETRY = "rs-deadline", "rs-reset", "rs-retry"
ALL = (*RESPONSE_RACES, *LAST_STEP_RACES, AT_DEADLINE, AT_RESET, AT_RETRY)


def cancel(api: str, order_id: str) -> requests.Response:
    return requests.post(f"{api}/orders/{order_id}/cancel", json={"reason": REASON}, timeout=WAIT)


def held(watch: Watch, n: int = 1) -> WatchedCall:
    """The watched action's ``n``-th call, applied, its answer held by the fake."""
    call = watch.call(n, timeout=WAIT)
    assert call.applied.wait(WAIT), f"{call.order_id}/{call.action} call {n} was not applied"
    return call


#: The actions undone in these races, by service, with their undo (core/workflow.py).
UNDO = {"inventory": ("reserve", "release"), "payments": ("charge", "refund")}


def assert_undone_once(stack, order_id: str, service: str) -> None:
    """The order's action at this service was applied once, and undone once."""
    action, undo = UNDO[service]
    seen = (stack.applied(service).get(order_id), stack.undone(service).get(order_id))
    assert seen == ([action], [undo]), (order_id, service, seen)


def cut_at_deadline(watch: Watch) -> WatchedCall:
    """The watched action's first call, once it ended unanswered: its agent left at Complete-By."""
    call = watch.call(1, timeout=WAIT)
    assert call.answered.wait(WAIT) and "client gone" in call.outcome, call.outcome
    return call


def test_cancels_racing_a_response_and_a_supervisor_reset_settle_then_undo_once(stack):
    stack.remote.set_faults(
        slow_seconds=HELD_SECONDS,
        script={
            **{f"{order_id}/reserve": ["slow"] for order_id in RESPONSE_RACES},
            # Once the response came first, charge runs: held until the cancel is on the row.
            **{f"{order_id}/charge": ["slow"] for order_id in RESPONSE_RACES},
            **{f"{order_id}/ship": ["slow"] for order_id in LAST_STEP_RACES},
            f"{AT_DEADLINE}/charge": ["slow"],  # applied, its answer lost: the supervisor resets the line
            f"{AT_RESET}/charge": ["slow"],
            f"{AT_RETRY}/charge": ["hang", "slow"],  # nothing applied, reset; the retry applied, held
        },
    )
    watch = {
        (order_id, action): stack.remote.watch(f"{order_id}/{action}")
        for order_id in ALL for action in ("reserve", "charge", "refund", "ship")
    }  # fmt: skip
    (host,) = stack.start_hosts(
        API_AUTH="none", STEP_TIMEOUT_SECONDS=STEP_TIMEOUT, REMOTE_CALL_TIMEOUT_SECONDS=CALL_TIMEOUT,
        RETRY_BACKOFF_BASE_SECONDS=RETRY_BACKOFF, RETRY_BACKOFF_MAX_SECONDS=RETRY_BACKOFF,
    )
    api = f"{host.http_url}/api"
    submitted = utcnow()
    stack.send([(order_id, order_json(order_id)) for order_id in ALL])

    def race(order_id: str, step: str, arrival: Arrival) -> requests.Response:
        """Cancel the order as ``arrival`` says, around the answer of its ``step``."""
        answer = held(watch[order_id, step])
        if arrival is Arrival.CANCEL_FIRST:
            reply = cancel(api, order_id)
            answer.release()
            return reply
        answer.release()
        if arrival is Arrival.RESPONSE_FIRST:
            wait_until(
                lambda: (s := stack.state(order_id)).step != step or s.process_state is ProcessState.PROCESSED,
                timeout=WAIT, what=f"{order_id}: {step}'s response recorded", interval=0.03,
            )
        return cancel(api, order_id)

    def race_response(order_id: str, arrival: Arrival) -> requests.Response:
        reply = race(order_id, "reserve", arrival)
        if reply.status_code == 202 and reply.json()["step"] == "charge":
            held(watch[order_id, "charge"]).release()  # claimed with reserve's response; the cancel is on the row
        return reply

    def at_deadline() -> requests.Response:
        cut_at_deadline(watch[AT_DEADLINE, "charge"])
        return cancel(api, AT_DEADLINE)

    def at_reset() -> requests.Response:
        cut_at_deadline(watch[AT_RESET, "charge"])
        wait_until(
            lambda: (s := stack.state(AT_RESET)).process_state is ProcessState.PENDING and s.failure_count == 1,
            timeout=WAIT, what=f"{AT_RESET}: the supervisor's reset of charge", interval=0.03,
        )
        return cancel(api, AT_RESET)

    def at_retry() -> requests.Response:
        cut_at_deadline(watch[AT_RETRY, "charge"])
        retry = held(watch[AT_RETRY, "charge"], 2)  # the retry's attempt in flight, its answer held
        reply = cancel(api, AT_RETRY)
        retry.release()
        return reply

    with ThreadPoolExecutor(len(ALL)) as pool:
        futures = {order_id: pool.submit(race_response, order_id, how) for order_id, how in RESPONSE_RACES.items()}
        futures |= {order_id: pool.submit(race, order_id, "ship", how) for order_id, how in LAST_STEP_RACES.items()}
        resets = {AT_DEADLINE: at_deadline, AT_RESET: at_reset, AT_RETRY: at_retry}
        futures |= {order_id: pool.submit(fire) for order_id, fire in resets.items()}
        replies = {order_id: future.result() for order_id, future in futures.items()}
    states = stack.wait_closed(list(ALL), timeout=120)

    # -- a cancel racing reserve's response: whichever came first, settled then undone -------
    first_came = {}
    for order_id in RESPONSE_RACES:
        reply, state = replies[order_id], states[order_id]
        assert reply.status_code == 202, (order_id, reply.text)
        document = reply.json()
        assert document["cancel"]["reason"] == REASON and document["kind"] == "action", document
        first_came[order_id] = "cancel" if document["step"] == "reserve" else "response"
        assert state.process_state is ProcessState.COMPENSATED, (order_id, state)
        assert "cancelled by the status API" in state.cause and REASON in state.cause, state.cause
        lines = stack.lines(order_id)
        claims = [(c.kind, c.action) for c in stack.claims(order_id)]
        if first_came[order_id] == "cancel":
            # reserve settled after the cancel (applied), then released; charge never claimed.
            assert document["step"] == "reserve" and lines[("reserve", A)].updated_at > state.cancel_requested_at
            assert claims == [(A, "reserve"), (C, "release")], (order_id, claims)
            assert line_states(stack, order_id) == {("reserve", A): "Done", ("reserve", C): "Done"}
            assert order_id not in stack.applied("payments")
        else:
            # reserve was recorded and charge claimed with it; the cancel came while charge was
            # in flight: charge settled (applied), then refund and release, newest first.
            assert document["step"] == "charge" and lines[("reserve", A)].updated_at < state.cancel_requested_at
            assert lines[("charge", A)].updated_at > state.cancel_requested_at
            assert claims == [(A, "reserve"), (A, "charge"), (C, "refund"), (C, "release")], (order_id, claims)
            assert_undone_once(stack, order_id, "payments")
        assert_undone_once(stack, order_id, "inventory")
        assert order_id not in stack.applied("shipping")
    # Both orders of arrival happened: the staged ones for certain, the simultaneous ones either way.
    assert first_came["rr-cancel"] == "cancel" and first_came["rr-response"] == "response", first_came

    # -- a cancel racing the last step's response: Processed and refused, or Error -----------
    alerts = {alert["order_id"]: alert for alert in stack.all_alerts()}
    for order_id in LAST_STEP_RACES:
        reply, state = replies[order_id], states[order_id]
        if reply.status_code == 409:  # ship's response was recorded first: every step is done
            first_came[order_id] = "response"
            assert "Processed" in reply.json()["reason"], reply.text
            assert state.process_state is ProcessState.PROCESSED and state.cancel_requested_at is None, state
            assert order_id not in alerts and stack.remote.net(order_id) == {
                "inventory": {"reserve": 1}, "payments": {"charge": 1}, "shipping": {"ship": 1},
            }
        else:  # the cancel first: ship settled (applied, it has no undo), then refund and release: Error
            first_came[order_id] = "cancel"
            assert reply.status_code == 202 and reply.json()["step"] == "ship", reply.text
            assert state.process_state is ProcessState.ERROR, state
            assert "could not undo step(s) ship" in state.last_error, state.last_error
            assert "cancelled by the status API" in state.last_error, state.last_error
            assert "ship" in alerts[order_id]["last_error"]
            assert_undone_once(stack, order_id, "payments")
            assert_undone_once(stack, order_id, "inventory")
            assert stack.remote.net(order_id) == {
                "inventory": {"reserve": 0}, "payments": {"charge": 0}, "shipping": {"ship": 1},
            }
    assert first_came["rl-cancel"] == "cancel" and first_came["rl-response"] == "response", first_came
    assert set(alerts) <= set(LAST_STEP_RACES), alerts  # the only Error: a cancel before ship settled

    # -- a cancel racing a supervisor reset: the attempt in flight settled first ----------------
    for order_id in (AT_DEADLINE, AT_RESET, AT_RETRY):
        reply, state = replies[order_id], states[order_id]
        assert reply.status_code == 202, (order_id, reply.text)
        assert state.process_state is ProcessState.COMPENSATED, (order_id, state)
        assert "cancelled by the status API" in state.cause and REASON in state.cause, state.cause
        first_attempt = watch[order_id, "charge"].calls[0]
        # Never undone while the held attempt could still act: only after its Complete-By.
        refund = watch[order_id, "refund"].calls[0]
        assert refund.arrived_at >= first_attempt.complete_by, (order_id, refund.arrived_at, first_attempt.complete_by)
        assert refund.arrived_at > state.cancel_requested_at
        assert_undone_once(stack, order_id, "inventory")
        assert order_id not in stack.applied("shipping")
        claims = [(c.kind, c.action) for c in stack.claims(order_id)]
        if order_id == AT_RETRY:
            # The retry's attempt answered after the cancel (applied): then refund and release.
            retry = watch[order_id, "charge"].calls[1]
            assert retry.attempt > first_attempt.attempt and retry.arrived_at > first_attempt.complete_by
            assert line_states(stack, order_id)[("charge", A)] == "Done"
            assert claims == [(A, "reserve"), (A, "charge"), (A, "charge"), (C, "refund"), (C, "release")], claims
        else:
            # The cancel landed on the expired or reset row before any retry: the line is not
            # run again; its outcome is unknown (the held attempt was applied): undone.
            assert len(watch[order_id, "charge"].calls) == 1, (
                f"{order_id}: charge ran again: its retry came before the cancel, {RETRY_BACKOFF} s after the reset"
            )
            assert line_states(stack, order_id)[("charge", A)] == "Cancelled"
            assert claims == [(A, "reserve"), (A, "charge"), (C, "refund"), (C, "release")], claims
        assert_undone_once(stack, order_id, "payments")

    for order_id in ALL:
        if order_id not in LAST_STEP_RACES:
            assert net_zero(stack.remote.net(order_id)), (order_id, stack.remote.net(order_id))
        stack.assert_within_bound(order_id, submitted)
    stack.assert_remote_clean()  # nothing applied twice, no call after its Complete-By
