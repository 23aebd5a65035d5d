"""Scheduler, completion and supervisor steps as plain functions on the local stack
(Azurite + the Service Bus emulator), each transition checked with its guard. Whole
workflows with every compensation path are in tests/unit/test_workflow.py (in-memory
table); here the same code runs against the real services."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest

from adapters import wiring
from adapters.wiring import services
from core import names
from core.models import AgentRequest, AgentResponse, LineState, Nudge, Outcome, ProcessState, utcnow
from core.workflow import ORDER_WORKFLOW, Kind
from devtools.orders import order_json
from scheduler import cancellation, dispatch
from scheduler.blueprint import scheduler, submit_order
from supervisor.supervision import NotResubmittable, policy_from, resubmit, sweep
from tests.factories import servicebus_message
from tests.fixtures.app import as_host, take_nudges, waiting_nudges
from tests.servicebus_helpers import bodies, receive

submit_handler = as_host(submit_order)  # its nudge goes through a queue output binding


def submit(order_id: str, reply_to: str | None = None) -> Nudge:
    """Submit, and take the nudge the submission put on the order's scheduler queue."""
    submit_handler(servicebus_message(order_json(order_id), message_id=order_id, reply_to=reply_to))
    (nudge,) = take_nudges(services().nudger)
    return nudge


def schedule(nudge: Nudge, now=None, instance="i1"):
    ctx = scheduler(services())
    if instance != ctx.instance:
        from dataclasses import replace

        ctx = replace(ctx, instance=instance)
    return dispatch.schedule(nudge, scheduler=ctx, now=now or utcnow())


def record(response: AgentResponse, now=None):
    return dispatch.record(response, scheduler=scheduler(services()), now=now or utcnow())


def last_request(app_settings, servicebus_emulator, remote: str) -> AgentRequest:
    (message,) = receive(servicebus_emulator.connection_string, app_settings[f"{remote.upper()}_REQUESTS_QUEUE"], 1)
    return AgentRequest.model_validate_json(str(message))


def supervise(now):
    s = services()
    return sweep(store=s.store, publisher=s.publisher, nudger=s.nudger, policy=policy_from(s.settings),
                 now=now, alerts_queue=s.settings.alerts_queue)


def answer(request: AgentRequest, outcome=Outcome.SUCCEEDED, **fields) -> AgentResponse:
    return AgentResponse(order_id=request.order_id, step=request.step, kind=request.kind, attempt=request.attempt,
                         outcome=outcome, context=request.context, **fields)


def nudges_waiting(include_invisible=False) -> list[Nudge]:
    return waiting_nudges(services().nudger, include_invisible=include_invisible)


def test_schedule_claims_once_and_sends_a_request_that_expires_at_complete_by(app_settings, servicebus_emulator):
    nudge = submit("o-1")
    request = schedule(nudge)
    assert schedule(nudge, instance="i2") is None  # the same nudge twice: the second loses the claim
    state = services().store.get("o-1")
    assert (state.process_state, state.attempt, state.locked_by) == (ProcessState.PROCESSING, 1, "i1")
    assert request.idempotency_key and request.order["order_id"] == "o-1"
    assert (request.step, request.kind, request.action, request.remote) == ("reserve", Kind.ACTION, "reserve", "inventory")
    (message,) = receive(servicebus_emulator.connection_string, app_settings["INVENTORY_REQUESTS_QUEUE"], 1)
    assert message.message_id == "o-1:reserve:1"
    assert message.subject == "reserve"
    assert message.correlation_id == "o-1"
    assert message.reply_to == app_settings["AGENT_RESPONSES_QUEUE"]
    assert timedelta(seconds=25) < message.time_to_live <= timedelta(seconds=30)


def test_the_first_claim_is_proven_by_its_seal_in_azurite_and_a_lying_nudge_is_claimed_from_the_rows(
    app_settings, servicebus_emulator
):
    """Against Azurite: the submission's nudge claims with one transaction (the If-Match
    MERGE and the seal's delete, If-Match *) and no read; a nudge with a forged document
    finds no seal (404 in the batch: the whole transaction fails) and the order is claimed
    from its rows, with its real document. (Submitted by this process, the order is claimed
    on the rows it wrote, whatever the nudge says: tests/unit/test_order_cache.py.)"""
    store = services().store
    nudge = submit("o-seal-1")
    store.ops.clear()
    assert schedule(nudge).step == "reserve"
    assert store.ops == {"transaction": 1}, store.ops
    forged_nudge = submit("o-seal-2")
    lying = forged_nudge.model_copy(update={"document": order_json("o-seal-2", total="0.01").decode()})
    services().cache.drop("o-seal-2")  # as if submitted by another instance: the nudge and the seal only
    store.ops.clear()
    request = schedule(lying)
    # The failed seal, the read, the claim: a transaction that deletes the seal the read saw.
    assert store.ops == {"transaction": 2, "query": 1}, store.ops
    assert store.read("o-seal-2").seal is None
    assert request.order == json.loads(store.read("o-seal-2").document) and request.order["total"] != "0.01"
    assert schedule(forged_nudge) is None  # the seal is gone once claimed: the row decides (not Pending)


def test_an_order_sent_with_an_empty_reply_to_is_claimed_from_its_nudge_and_its_true_response_counts(
    app_settings, servicebus_emulator
):
    """Against Azurite: a ReplyTo of no characters names no queue, and Table Storage gives the empty text back as
    none. The submission's nudge says none as well, so the first claim from the nudge (the order submitted by
    another instance) sends the row as it is in its fence, and the agent's true response moves the order on
    instead of being dropped as forged."""
    s = services()
    nudge = submit("o-empty-reply", reply_to="")
    s.cache.drop("o-empty-reply")  # as if submitted by another instance: the nudge and the seal only
    assert nudge.state.reply_to is None and s.store.get("o-empty-reply").reply_to is None
    request = schedule(nudge)
    assert request.context.fence == s.store.get("o-empty-reply")
    assert last_request(app_settings, servicebus_emulator, "inventory") == request
    moved = record(answer(request, result={"confirmation": "c-reserve"}))
    assert moved is not None and (moved.step, moved.attempt) == ("charge", 2)


def test_a_write_before_the_first_claim_takes_the_seal_and_a_forged_first_claim_is_decided_on_the_row(
    app_settings, servicebus_emulator
):
    """Against Azurite: a cancel recorded on an order never claimed, and a supervisor's re-nudge of one whose nudge
    was lost, each delete the seal in their own transaction. The submission's nudge with the row's new ETag (what
    someone who read it would send) then fails whole (the seal's 404) and is decided on the row as read: after the
    cancel, dropped as forged (no request); after the re-nudge, the first attempt of reserve the row warrants."""
    s = services()
    submitted = submit("o-seal-3")
    s.cache.drop("o-seal-3")  # as if submitted by another instance: the nudge and the seal only
    cancellation.cancel("o-seal-3", reason="asked", by="ops", store=s.store, publisher=s.publisher, nudger=s.nudger,
                        now=utcnow())
    row = s.store.read("o-seal-3")
    assert row.seal is None and row.state.cancel_requested_at is not None
    forged = submitted.model_copy(update={"state": submitted.state.model_copy(update={"etag": row.state.etag})})
    s.store.ops.clear()
    assert schedule(forged) is None
    assert s.store.ops == {"transaction": 1, "query": 1}, s.store.ops  # the seal's 404, the read that tells it
    assert s.store.read("o-seal-3") == row
    assert receive(servicebus_emulator.connection_string, app_settings["INVENTORY_REQUESTS_QUEUE"], 1, timeout=1) == []
    assert [n.order_id for n in take_nudges(s.nudger)] == ["o-seal-3"]  # the cancel's own

    submitted = submit("o-seal-4")
    s.cache.drop("o-seal-4")
    assert supervise(submitted.state.complete_by + timedelta(seconds=1))["renudge"] >= 1
    row = s.store.read("o-seal-4")
    assert row.seal is None
    forged = submitted.model_copy(update={"state": submitted.state.model_copy(update={"etag": row.state.etag})})
    s.store.ops.clear()
    request = schedule(forged)
    assert s.store.ops == {"transaction": 1, "query": 1, "update": 1}, s.store.ops  # the 404, the read, the claim
    assert (request.step, request.attempt) == ("reserve", 1) and request.order == json.loads(row.document)


def test_each_step_goes_to_its_own_agent_queue_and_the_last_success_leaves_the_index(
    app_settings, servicebus_emulator
):
    servicebus_emulator.declare_queue("replies-o2")
    schedule(submit("o-2", reply_to="replies-o2"))
    for step, remote in (("reserve", "inventory"), ("charge", "payments"), ("ship", "shipping")):
        sent = last_request(app_settings, servicebus_emulator, remote)
        assert sent.step == step
        done = record(answer(sent, result={"confirmation": f"c-{step}"}))
        assert record(answer(sent)) is None  # a duplicate response changes nothing
    assert done.process_state is ProcessState.PROCESSED
    record_ = services().store.read("o-2")
    assert {(line.step, line.state) for line in record_.lines} == {
        ("reserve", LineState.DONE), ("charge", LineState.DONE), ("ship", LineState.DONE)
    }
    assert {line.step: line.result for line in record_.lines}["charge"] == {"confirmation": "c-charge"}
    assert services().store.active_ids() == []
    events = bodies(receive(servicebus_emulator.connection_string, "replies-o2", 5))
    assert [(e["status"], e.get("step")) for e in events] == [
        ("received", None), ("processing", "reserve"), ("processing", "charge"), ("processing", "ship"),
        ("processed", None),
    ]


def test_a_stale_attempt_changes_nothing(app_settings):
    request = schedule(submit("o-3"))
    stale = answer(request).model_copy(update={"attempt": 0})
    assert record(stale) is None
    assert services().store.get("o-3").process_state is ProcessState.PROCESSING


def test_a_stale_fence_is_decided_again_on_the_row(app_settings):
    request = schedule(submit("o-4"))
    s = services()
    current = s.store.get("o-4")
    s.store.write(current, current.model_copy(update={"last_error": "touched"}))  # the ETag moves
    assert record(answer(request)).step == "charge"


def test_a_refusal_at_step_2_is_undone_in_one_transaction_each_and_ends_compensated(app_settings, servicebus_emulator):
    schedule(submit("o-5"))
    record(answer(last_request(app_settings, servicebus_emulator, "inventory"), result={"hold": "h-1"}))
    charge = last_request(app_settings, servicebus_emulator, "payments")
    undoing = record(answer(charge, Outcome.FAILED_PERMANENT, error="HTTP 422: card declined"))
    assert (undoing.process_state, undoing.kind, undoing.step) == (ProcessState.PROCESSING, Kind.COMPENSATION, "reserve")
    release = last_request(app_settings, servicebus_emulator, "inventory")
    assert (release.kind, release.action, release.result) == (Kind.COMPENSATION, "release", {"hold": "h-1"})
    assert release.idempotency_key not in {charge.idempotency_key}
    done = record(answer(release))
    assert done.process_state is ProcessState.COMPENSATED and "card declined" in done.last_error
    assert receive(servicebus_emulator.connection_string, app_settings["ALERTS_QUEUE"], 1, timeout=1) == []
    assert services().store.active_ids() == []


def test_supervisor_resets_with_backoff_then_gives_up_and_the_scheduler_undoes_the_step(
    app_settings, servicebus_emulator
):
    servicebus_emulator.declare_queue("replies-o6")
    s = services()
    schedule(submit("o-6", reply_to="replies-o6"))
    receive(servicebus_emulator.connection_string, app_settings["INVENTORY_REQUESTS_QUEUE"], 1)
    now = utcnow()
    for failure in range(1, s.settings.max_failures):
        now += s.settings.step_timeout + timedelta(seconds=1)
        assert supervise(now)["retry"] == 1
        state = s.store.get("o-6")
        assert (state.process_state, state.failure_count, state.locked_by) == (ProcessState.PENDING, failure, None)
        # The retry nudge is delayed by the backoff: invisible for now.
        assert nudges_waiting() == [] and len(nudges_waiting(include_invisible=True)) >= 1
        for queue in s.nudger.queues:
            queue.clear_messages()
        schedule(Nudge(order_id="o-6"), now=now + timedelta(seconds=300))
        now += timedelta(seconds=300)
    now += s.settings.step_timeout + timedelta(seconds=1)
    assert supervise(now)["give_up"] == 1
    state = s.store.get("o-6")
    assert state.process_state is ProcessState.PENDING and state.gave_up
    assert state.failure_count == s.settings.max_failures
    # The supervisor only handed it back: the scheduler undoes reserve (its outcome is unknown).
    (nudge,) = nudges_waiting()
    release = schedule(nudge, now=now)
    assert (release.kind, release.action) == (Kind.COMPENSATION, "release")
    done = record(answer(release), now=now)
    assert done.process_state is ProcessState.COMPENSATED
    assert supervise(now + timedelta(hours=1)) == {}  # not retried after that
    statuses = [e["status"] for e in bodies(receive(servicebus_emulator.connection_string, "replies-o6", 10, timeout=3))]
    assert statuses.count("retrying") == s.settings.max_failures - 1
    assert statuses[-2:] == ["compensating", "compensated"]


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


def test_resubmit_only_from_error_and_it_continues_with_the_failed_undo(app_settings, servicebus_emulator):
    s = services()
    schedule(submit("o-9"))
    try:
        resubmit("o-9", store=s.store, nudger=s.nudger, now=utcnow(), pending_timeout=s.settings.pending_timeout)
        raise AssertionError("resubmitted a Processing order")
    except NotResubmittable as refused:
        assert "Processing" in str(refused)
    record(answer(last_request(app_settings, servicebus_emulator, "inventory")))  # reserve done
    charge = last_request(app_settings, servicebus_emulator, "payments")
    record(answer(charge, Outcome.FAILED_PERMANENT, error="declined"))
    release = last_request(app_settings, servicebus_emulator, "inventory")
    failed = record(answer(release, Outcome.FAILED_PERMANENT, error="HTTP 404: no such hold"))
    assert failed.process_state is ProcessState.ERROR
    (alert,) = bodies(receive(servicebus_emulator.connection_string, app_settings["ALERTS_QUEUE"], 2, timeout=3))
    assert alert["order_id"] == "o-9" and alert["failed_compensations"] == ["reserve"]
    again = resubmit("o-9", store=s.store, nudger=s.nudger, now=utcnow(), pending_timeout=s.settings.pending_timeout)
    assert (again.process_state, again.failure_count, again.step) == (ProcessState.PENDING, 0, "reserve")
    assert [row[0] for row in s.store.active_ids()] == ["o-9"]
    retried = schedule(nudges_waiting()[0])
    assert (retried.action, retried.idempotency_key) == ("release", release.idempotency_key)
    assert retried.attempt == release.attempt + 1  # a new fencing token: the failed attempt's responses stay stale
    assert record(answer(release)) is None
    assert record(answer(retried)).process_state is ProcessState.COMPENSATED


@pytest.mark.parametrize("new_shards", [8, 2])
def test_changing_the_shard_count_with_orders_in_flight_loses_none(
    app_settings, servicebus_emulator, monkeypatch, new_shards
):
    """Orders taken in under ACTIVE_INDEX_SHARDS=4, the hosts restarted with another count:
    the supervisor still finds every expired one, moves its index row to its new shard, and
    every order finishes with its index row gone, including orders that finished before any
    sweep ran (their row under the old count is healed away by the next sweep)."""

    def restart_with(shards: int):
        monkeypatch.setenv(names.ACTIVE_INDEX_SHARDS_SETTING, str(shards))
        wiring.reset()
        assert services().store.shards == shards

    restart_with(4)
    stuck = [f"o-s{new_shards}-{i}" for i in range(6)]  # claimed, then their hosts went away
    def shard_changed(order_id: str) -> bool:
        return names.active_shard(order_id, 4) != names.active_shard(order_id, new_shards)

    # Submitted, finished after the change: two whose shard changes with the count, one whose does not.
    ids = [f"o-q{new_shards}-{i}" for i in range(50)]
    left_behind = [o for o in ids if shard_changed(o)][:2]
    quick = [*left_behind, next(o for o in ids if not shard_changed(o))]
    requests = {order_id: schedule(submit(order_id)) for order_id in stuck}
    for order_id in quick:
        submit(order_id)
    old_rows = index_rows(services().store)
    assert {order_id for order_id, _ in old_rows} == {*stuck, *quick}
    assert all(partition == names.active_partition(names.active_shard(o, 4)) for o, partition in old_rows)
    receive(servicebus_emulator.connection_string, app_settings["INVENTORY_REQUESTS_QUEUE"], len(stuck))

    restart_with(new_shards)
    store = services().store
    for order_id in quick:  # finished wholly under the new count, before any sweep
        finish(schedule(Nudge(order_id=order_id)), app_settings, servicebus_emulator)
    later = utcnow() + services().settings.step_timeout + timedelta(seconds=1)
    # Every expired order found under the old count; the quick orders' rows under the old
    # count (terminal, still indexed) closed again (a repeated status event, as after a
    # crash) and dropped.
    assert any(shard_changed(o) for o in stuck)
    assert dict(supervise(later)) == {"retry": len(stuck), "healed": len(left_behind)}
    moved = dict(index_rows(store))
    assert moved == {o: names.active_partition(names.active_shard(o, new_shards)) for o in stuck}
    for order_id in stuck:
        retried = schedule(Nudge(order_id=order_id))
        assert (retried.step, retried.attempt) == ("reserve", requests[order_id].attempt + 1)
        assert finish(retried, app_settings, servicebus_emulator) is ProcessState.PROCESSED
    assert store.active_ids() == []
    assert {store.get(o).process_state for o in (*stuck, *quick)} == {ProcessState.PROCESSED}


def index_rows(store) -> list[tuple[str, str]]:
    """(order id, partition) of every index row, wherever it is."""
    return [(row.order_id, row.partition) for row in store._all_index_rows()]  # noqa: SLF001 - the test looks inside


def finish(request: AgentRequest, app_settings, servicebus_emulator) -> ProcessState:
    """Answer every step of an order as done, from the request of its current step."""
    while True:
        state = record(answer(request))
        if state.process_state.terminal:
            return state.process_state
        request = last_request(app_settings, servicebus_emulator, ORDER_WORKFLOW.steps[state.step_index].remote)
