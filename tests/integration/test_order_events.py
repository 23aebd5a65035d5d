"""Events for waiting steps on Azurite and the Service Bus emulator: the approval
workflow's order submitted as a client sends it, run by the scheduler's plain functions,
and its approval sent by the API's function (api/events.py) and by an ``order-events``
message (the ``receive_order_event`` function), each reply and each refusal checked
against the rows; the deadline's expiry through the supervisor's sweep."""

from __future__ import annotations

import base64
import json
from datetime import timedelta

from adapters.wiring import services
from api.events import post_event
from api.orders import serve
from core import access
from core.models import OrderEvent, ProcessState, utcnow
from core.workflow import Kind
from devtools.orders import order_json
from scheduler.blueprint import receive_order_event, scheduler
from tests.factories import servicebus_message
from tests.integration.test_dispatch_and_supervise import (
    answer,
    last_request,
    record,
    schedule,
    submit_handler,
    supervise,
)
from tests.fixtures.app import take_nudges
from tests.servicebus_helpers import receive

receive_handler = receive_order_event.build().get_user_function()
APPROVE = json.dumps({"approved": True, "by": "alice", "note": "fine"}).encode()
REJECT = json.dumps({"approved": False, "by": "bob", "note": "too much"}).encode()


def waiting_order(order_id: str, app_settings, servicebus_emulator) -> None:
    """Submit an order-approval order and run its reserve: it then waits for its approval."""
    submit_handler(servicebus_message(order_json(order_id, workflow="order-approval"), message_id=order_id))
    (nudge,) = take_nudges(services().nudger)
    schedule(nudge)
    record(answer(last_request(app_settings, servicebus_emulator, "inventory"), result={"hold": f"h-{order_id}"}))
    state = services().store.get(order_id)
    assert (state.workflow, state.step, state.process_state) == ("order-approval", "approve", ProcessState.PROCESSING)


def post(order_id: str, body: bytes, name: str = "approval", now=None):
    """As the route serves it (api/blueprint.py): the caller's role checked, a 400 for bad input."""
    return serve(
        "POST", {}, methods=("POST",), roles=access.OPERATE_ROLES, mode=access.ApiAuth.NONE,
        action=lambda: post_event(order_id, name, body, scheduler=scheduler(services()), now=now or utcnow()),
    )


def event_message(order_id: str, approved: bool, **fields) -> object:
    event = OrderEvent(order_id=order_id, name="approval", approved=approved, by="carol", **fields)
    return servicebus_message(event.model_dump_json(exclude_none=True).encode(), message_id=event.message_id())


def test_an_order_without_a_workflow_field_runs_the_default_and_an_unknown_workflow_is_rejected(app_settings):
    submit_handler(servicebus_message(order_json("d-1"), message_id="d-1"))
    assert services().store.get("d-1").workflow == "order"
    submit_handler(servicebus_message(order_json("d-2", workflow="express"), message_id="d-2"))
    (rejection,) = services().rejections.list()
    assert "unknown workflow 'express'" in rejection["Reason"] and "order-approval" in rejection["Reason"]


def test_approved_over_the_api_the_document_shows_the_result_and_the_charge_is_sent(app_settings, servicebus_emulator):
    waiting_order("e-1", app_settings, servicebus_emulator)
    shown = services().store.read("e-1")
    from core.progress import status_document

    document = status_document(shown.state, shown.document, shown.lines)
    assert document["waiting"] == {"event": "approval", "step": "approve", "until": shown.state.complete_by.isoformat()}
    assert [s["state"] for s in document["steps"]] == ["Done", "WaitingForEvent", "NotStarted", "NotStarted"]

    reply = post("e-1", APPROVE)
    assert reply.status == 202, reply.body
    assert reply.body["waiting"] is None and reply.body["step"] == "charge"
    assert reply.body["steps"][1]["result"] == {"approved": True, "by": "alice", "note": "fine"}
    charge = last_request(app_settings, servicebus_emulator, "payments")
    assert charge.context.results["approve"] == {"approved": True, "by": "alice", "note": "fine"}

    again = post("e-1", APPROVE)  # the same event: a no-op, the order as it is
    assert again.status == 202 and again.body == post("e-1", APPROVE).body
    assert receive(servicebus_emulator.connection_string, app_settings["PAYMENTS_REQUESTS_QUEUE"], 1, timeout=1) == []
    refused = post("e-1", REJECT)
    assert refused.status == 409 and refused.body["error"] == "conflict" and "charge" in refused.body["reason"]
    assert services().store.get("e-1").step == "charge"


def test_an_approval_over_the_api_records_the_signed_in_caller_whatever_the_body_says(app_settings, servicebus_emulator):
    """With App Service Authentication the principal's name is who approved (the audit
    trail), as a cancel records its caller: a body's "by" names no one the API checked."""
    waiting_order("e-by", app_settings, servicebus_emulator)
    principal = base64.b64encode(json.dumps({
        "auth_typ": "aad", "name_typ": "name", "role_typ": "roles",
        "claims": [{"typ": "name", "val": "dana@example.test"}, {"typ": "roles", "val": access.OPERATOR_ROLE}],
    }).encode()).decode()
    who = access.signed_in(access.ApiAuth.EASYAUTH, {"X-MS-CLIENT-PRINCIPAL": principal})
    assert who == "dana@example.test" and access.signed_in(access.ApiAuth.NONE, {"X-MS-CLIENT-PRINCIPAL": principal}) is None
    reply = post_event("e-by", "approval", APPROVE, scheduler=scheduler(services()), now=utcnow(), signed_in=who)
    assert reply.status == 202, reply.body
    assert reply.body["steps"][1]["result"] == {"approved": True, "by": "dana@example.test", "note": "fine"}


def test_the_api_refuses_bad_input_and_unknown_orders_without_changing_anything(app_settings, servicebus_emulator):
    waiting_order("e-2", app_settings, servicebus_emulator)
    before = services().store.get("e-2")
    assert post("e-2", APPROVE, name="payment").status == 400
    assert post("e-2", b'{"approved": "yes", "by": "a"}').status == 400
    assert post("e-2", b'{"approved": true}').status == 400
    assert post("e-2", b"not json").status == 400
    assert post("e-2", b'{"approved": true, "by": "a", "extra": 1}').status == 400
    assert post("bad id!", APPROVE).status == 400
    assert post("nobody", APPROVE).status == 404
    assert services().store.get("e-2") == before


def test_rejected_by_message_the_reservation_is_released_once_and_the_order_ends_compensated(
    app_settings, servicebus_emulator
):
    waiting_order("e-3", app_settings, servicebus_emulator)
    receive_handler(event_message("e-3", False, note="fraud check"))
    release = last_request(app_settings, servicebus_emulator, "inventory")
    assert (release.kind, release.action, release.result) == (Kind.COMPENSATION, "release", {"hold": "h-e-3"})
    done = record(answer(release))
    assert done.process_state is ProcessState.COMPENSATED
    assert done.cause == "step approve: approval rejected by carol: fraud check"
    receive_handler(event_message("e-3", False, note="fraud check"))  # a duplicate: nothing, no rejection
    assert services().rejections.list() == []
    assert receive(servicebus_emulator.connection_string, app_settings["INVENTORY_REQUESTS_QUEUE"], 1, timeout=1) == []


def test_an_event_message_nobody_waits_for_or_that_is_invalid_is_kept_with_its_reason(app_settings, servicebus_emulator):
    submit_handler(servicebus_message(order_json("e-4"), message_id="e-4"))  # the default workflow: no wait
    before = services().store.get("e-4")
    receive_handler(event_message("e-4", True))
    receive_handler(event_message("e-404", True))
    receive_handler(servicebus_message(b'{"order_id": "e-4", "name": "approval"}', message_id="bad-1"))
    reasons = {row["MessageId"]: (row["Source"], row["Reason"]) for row in services().rejections.list()}
    assert reasons["bad-1"][0] == "order-events" and "approved" in reasons["bad-1"][1]
    assert any("no step waits for approval" in reason for _, reason in reasons.values())
    assert any("no order 'e-404'" in reason for _, reason in reasons.values())
    assert services().store.get("e-4") == before


def test_timed_out_the_supervisor_gives_up_and_the_scheduler_releases_the_reservation(app_settings, servicebus_emulator):
    waiting_order("e-5", app_settings, servicebus_emulator)
    deadline = services().store.get("e-5").complete_by
    assert supervise(deadline + timedelta(seconds=1))["give_up"] == 1
    late = post("e-5", APPROVE, now=deadline + timedelta(seconds=2))
    assert late.status == 409
    (nudge,) = take_nudges(services().nudger)
    release = schedule(nudge, now=deadline + timedelta(seconds=2))
    assert (release.kind, release.action) == (Kind.COMPENSATION, "release")
    done = record(answer(release), now=deadline + timedelta(seconds=3))
    assert done.process_state is ProcessState.COMPENSATED
    assert done.cause.startswith("step approve timed out waiting for approval: gave up after 1 failed attempts")
