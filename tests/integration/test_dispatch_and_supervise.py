"""Scheduler, completion and supervisor steps as plain functions on the local stack
(Azurite + the Service Bus emulator), each transition checked with its guard."""

from __future__ import annotations

import threading
from datetime import timedelta

from azure.storage.queue import QueueClient

from core.models import STEP, AgentRequest, AgentResponse, Nudge, Outcome, ProcessState, utcnow
from adapters.wiring import services
from scheduler import dispatch
from scheduler.blueprint import submit_order
from supervisor.supervision import NotResubmittable, policy_from, resubmit, sweep
from tests.factories import Captured, order_json, servicebus_message
from tests.servicebus_helpers import bodies, receive

submit_handler = submit_order.build().get_user_function()


def submit(order_id: str, reply_to: str | None = None) -> Nudge:
    nudge = Captured()
    submit_handler(servicebus_message(order_json(order_id), message_id=order_id, reply_to=reply_to), nudge)
    return Nudge.model_validate_json(nudge.value)


def schedule(nudge: Nudge, now=None, instance="i1"):
    s = services()
    return dispatch.schedule(
        nudge, store=s.store, publisher=s.publisher, instance=instance, now=now or utcnow(),
        step_timeout=s.settings.step_timeout, requests_queue=s.settings.agent_requests_queue,
        responses_queue=s.settings.agent_responses_queue,
    )


def record(response: AgentResponse, now=None):
    s = services()
    return dispatch.record(response, store=s.store, publisher=s.publisher, now=now or utcnow(),
                           alerts_queue=s.settings.alerts_queue)


def supervise(now):
    s = services()
    return sweep(store=s.store, publisher=s.publisher, nudger=s.nudger, policy=policy_from(s.settings),
                 now=now, alerts_queue=s.settings.alerts_queue)


def answer(request: AgentRequest, outcome=Outcome.SUCCEEDED, **fields) -> AgentResponse:
    return AgentResponse(order_id=request.order_id, step=request.step, attempt=request.attempt,
                         outcome=outcome, fence=request.fence, **fields)


def nudges_waiting(include_invisible=False) -> list[Nudge]:
    queue: QueueClient = services().nudger.queue
    props = queue.get_queue_properties()
    if include_invisible:
        return [None] * props.approximate_message_count
    return [Nudge.model_validate_json(m.content) for m in queue.peek_messages(max_messages=32)]


def test_schedule_claims_once_and_sends_a_request_that_expires_at_complete_by(app_settings, servicebus_emulator):
    nudge = submit("o-1")
    request = schedule(nudge)
    assert schedule(nudge, instance="i2") is None  # the same nudge twice: the second loses the claim
    state = services().store.get("o-1")
    assert (state.process_state, state.attempt, state.locked_by) == (ProcessState.PROCESSING, 1, "i1")
    assert request.idempotency_key and request.payload["order_id"] == "o-1"
    (message,) = receive(servicebus_emulator.connection_string, app_settings["AGENT_REQUESTS_QUEUE"], 1)
    assert message.message_id == f"o-1:{STEP}:1"
    assert message.correlation_id == "o-1"
    assert message.reply_to == app_settings["AGENT_RESPONSES_QUEUE"]
    assert timedelta(seconds=25) < message.time_to_live <= timedelta(seconds=30)


def test_success_is_recorded_once_and_leaves_the_active_index(app_settings, servicebus_emulator):
    servicebus_emulator.declare_queue("replies-o2")
    request = schedule(submit("o-2", reply_to="replies-o2"))
    done = record(answer(request, result={"confirmation": "c"}))
    assert done.process_state is ProcessState.PROCESSED
    stored = services().store.get("o-2")
    assert record(answer(request)) is None  # a duplicate response
    assert services().store.get("o-2") == stored
    assert services().store.active_ids() == []
    events = bodies(receive(servicebus_emulator.connection_string, "replies-o2", 3))
    assert [e["status"] for e in events] == ["received", "processing", "processed"]


def test_a_stale_attempt_changes_nothing(app_settings):
    request = schedule(submit("o-3"))
    stale = answer(request).model_copy(update={"attempt": 0, "fence": None})
    assert record(stale) is None
    assert services().store.get("o-3").process_state is ProcessState.PROCESSING


def test_a_stale_fence_is_decided_again_on_the_row(app_settings):
    request = schedule(submit("o-4"))
    s = services()
    current = s.store.get("o-4")
    s.store.write(current, current.model_copy(update={"last_error": "touched"}))  # the ETag moves
    assert record(answer(request)).process_state is ProcessState.PROCESSED


def test_permanent_failure_is_error_with_one_alert(app_settings, servicebus_emulator):
    request = schedule(submit("o-5"))
    failed = record(answer(request, Outcome.FAILED_PERMANENT, error="HTTP 422: no such sku"))
    assert failed.process_state is ProcessState.ERROR and "422" in failed.last_error
    (alert,) = bodies(receive(servicebus_emulator.connection_string, app_settings["ALERTS_QUEUE"], 2, timeout=3))
    assert alert["order_id"] == "o-5" and "422" in alert["last_error"]


def test_supervisor_resets_with_backoff_then_gives_up_with_an_alert(app_settings, servicebus_emulator):
    servicebus_emulator.declare_queue("replies-o6")
    s = services()
    schedule(submit("o-6", reply_to="replies-o6"))
    receive(servicebus_emulator.connection_string, app_settings["AGENT_REQUESTS_QUEUE"], 1)
    now = utcnow()
    for failure in range(1, s.settings.max_failures):
        now += s.settings.step_timeout + timedelta(seconds=1)
        assert supervise(now)["retry"] == 1
        state = s.store.get("o-6")
        assert (state.process_state, state.failure_count, state.locked_by) == (ProcessState.PENDING, failure, None)
        # The retry nudge is delayed by the backoff: invisible for now.
        assert nudges_waiting() == [] and len(nudges_waiting(include_invisible=True)) >= 1
        s.nudger.queue.clear_messages()
        schedule(Nudge(order_id="o-6"), now=now + timedelta(seconds=300))
        now += timedelta(seconds=300)
    now += s.settings.step_timeout + timedelta(seconds=1)
    assert supervise(now)["give_up"] == 1
    state = s.store.get("o-6")
    assert state.process_state is ProcessState.ERROR and state.failure_count == s.settings.max_failures
    assert supervise(now + timedelta(hours=1)) == {}  # not retried after that
    alerts = bodies(receive(servicebus_emulator.connection_string, app_settings["ALERTS_QUEUE"], 2, timeout=3))
    assert [a["order_id"] for a in alerts] == ["o-6"]
    statuses = [e["status"] for e in bodies(receive(servicebus_emulator.connection_string, "replies-o6", 10, timeout=3))]
    assert statuses.count("retrying") == s.settings.max_failures - 1 and statuses[-1] == "failed"


def test_expired_pending_is_nudged_again_without_a_failure(app_settings):
    s = services()
    submit("o-7")  # its nudge is "lost": never scheduled
    done = supervise(utcnow() + s.settings.pending_timeout + timedelta(seconds=1))
    assert done["renudge"] == 1
    assert s.store.get("o-7").failure_count == 0
    assert [n.order_id for n in nudges_waiting()] == ["o-7"]


def test_two_overlapping_supervisors_act_once_per_row(app_settings, storage_connection_string):
    from adapters.wiring import Services

    s = services()
    for i in range(20):
        schedule(submit(f"o-8-{i}"))
    later = utcnow() + s.settings.step_timeout + timedelta(seconds=1)
    other = Services.from_settings(s.settings)  # a second supervisor instance with its own clients
    results = []

    def run(svc):
        results.append(sweep(store=svc.store, publisher=svc.publisher, nudger=svc.nudger,
                             policy=policy_from(svc.settings), now=later, alerts_queue=svc.settings.alerts_queue))

    threads = [threading.Thread(target=run, args=(svc,)) for svc in (s, other)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    other.publisher.close()
    assert sum(r["retry"] for r in results) == 20
    assert {s.store.get(f"o-8-{i}").failure_count for i in range(20)} == {1}


def test_resubmit_only_from_error(app_settings):
    s = services()
    request = schedule(submit("o-9"))
    try:
        resubmit("o-9", store=s.store, nudger=s.nudger, now=utcnow(), pending_timeout=s.settings.pending_timeout)
        raise AssertionError("resubmitted a Processing order")
    except NotResubmittable as refused:
        assert "Processing" in str(refused)
    record(answer(request, Outcome.FAILED_PERMANENT, error="bad"))
    again = resubmit("o-9", store=s.store, nudger=s.nudger, now=utcnow(), pending_timeout=s.settings.pending_timeout)
    assert (again.process_state, again.failure_count) == (ProcessState.PENDING, 0)
    assert [row[0] for row in s.store.active_ids()] == ["o-9"]
    retried = schedule(nudges_waiting()[0])
    assert retried.attempt == 2  # a new fencing token: the failed attempt's responses stay stale
