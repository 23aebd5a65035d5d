"""Cancel against the real services (Azurite, the Service Bus emulator), through the same
plain functions the app binds: the cancel is one If-Match write, and a response or a
supervisor reset that races it makes it decide again on the new row, never overwrite it.
The interleavings one by one are tests/unit/test_cancel.py's (in-memory table); the same
races on the whole local stack, tests/e2e/test_cancel_races.py's."""

from __future__ import annotations

import threading
from datetime import timedelta

from adapters.wiring import services
from core.lifecycle import CancelVerdict
from core.models import Nudge, ProcessState, utcnow
from core.workflow import Kind
from scheduler import cancellation
from tests.integration.test_dispatch_and_supervise import answer, last_request, record, schedule, submit, supervise

RACERS = 8


def cancel(order_id: str, reason: str = "race"):
    s = services()
    return cancellation.cancel(order_id, reason=reason, by="test", store=s.store, publisher=s.publisher,
                               nudger=s.nudger, now=utcnow())


def test_concurrent_cancels_record_one_and_the_others_are_no_ops(app_settings, servicebus_emulator):
    schedule(submit("r-1"))
    verdicts, barrier = [], threading.Barrier(RACERS)

    def one(n: int) -> None:
        barrier.wait()
        verdicts.append(cancel("r-1", reason=f"racer {n}").verdict)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(verdicts) == sorted([CancelVerdict.RECORDED] + [CancelVerdict.ALREADY] * (RACERS - 1))
    state = services().store.get("r-1")
    assert state.cancel_reason.startswith("racer ") and state.process_state is ProcessState.PROCESSING


def test_a_cancel_racing_a_response_and_a_reset_applies_nothing_twice(app_settings, servicebus_emulator):
    schedule(submit("r-2"))
    reserve = last_request(app_settings, servicebus_emulator, "inventory")
    # The response and the cancel race: whichever writes second decides on the other's row.
    responder = threading.Thread(target=lambda: record(answer(reserve, result={"r": 1})))
    responder.start()
    assert cancel("r-2").verdict is CancelVerdict.RECORDED
    responder.join()
    state = services().store.get("r-2")
    assert state.cancel_requested_at is not None
    if state.kind is Kind.ACTION:  # the response came first: charge was claimed before the cancel
        assert state.step == "charge"
        charge = last_request(app_settings, servicebus_emulator, "payments")
        # Charge's deadline passes: the supervisor resets it; the scheduler undoes instead of running it again.
        later = state.complete_by + timedelta(seconds=1)
        assert supervise(later)["retry"] == 1
        schedule(Nudge(order_id="r-2"), now=later)  # the reset's nudge (delayed by the backoff)
        assert record(answer(charge, result={"c": 1}), now=later) is None  # charge's late answer: fenced out
    refund_or_release = services().store.get("r-2")
    assert refund_or_release.kind is Kind.COMPENSATION and "race" in refund_or_release.cause
