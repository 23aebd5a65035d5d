"""Bindings of the scheduler's functions. No decisions here: parse at the edge, call the
plain functions in ``submission`` and ``dispatch`` with the process's collaborators."""

from __future__ import annotations

import logging

import azure.functions as func

from core import names
from core.models import AgentResponse, Nudge, utcnow
from adapters.wiring import services
from scheduler import dispatch, submission

log = logging.getLogger(__name__)
bp = func.Blueprint()


@bp.function_name("submit_order")
@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=f"%{names.ORDERS_QUEUE_SETTING}%", connection=names.SERVICEBUS_CONNECTION
)
@bp.queue_output(arg_name="nudge", queue_name=f"%{names.SCHEDULER_QUEUE_SETTING}%", connection=names.STORAGE_CONNECTION)
def submit_order(msg: func.ServiceBusMessage, nudge: func.Out[str]) -> None:
    s = services()
    result = submission.submit(
        msg.get_body(),
        message_id=msg.message_id,
        reply_to=msg.reply_to,
        content_type=msg.content_type,
        store=s.store,
        rejections=s.rejections,
        publisher=s.publisher,
        now=utcnow(),
        pending_timeout=s.settings.pending_timeout,
    )
    if result.nudge is not None:
        nudge.set(result.nudge.model_dump_json(exclude_none=True))


@bp.function_name("schedule_order")
@bp.queue_trigger(arg_name="msg", queue_name=f"%{names.SCHEDULER_QUEUE_SETTING}%", connection=names.STORAGE_CONNECTION)
def schedule_order(msg: func.QueueMessage) -> None:
    s = services()
    try:
        nudge = Nudge.model_validate_json(msg.get_body())
    except ValueError as error:
        # Not one of ours: dropping it loses no order (the supervisor re-nudges
        # every Pending row whose deadline passes).
        log.error("malformed nudge %s dropped: %s", msg.id, error)
        return
    dispatch.schedule(
        nudge,
        store=s.store,
        publisher=s.publisher,
        instance=s.instance,
        now=utcnow(),
        step_timeout=s.settings.step_timeout,
        requests_queue=s.settings.agent_requests_queue,
        responses_queue=s.settings.agent_responses_queue,
    )


@bp.function_name("complete_step")
@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=f"%{names.AGENT_RESPONSES_QUEUE_SETTING}%", connection=names.SERVICEBUS_CONNECTION
)
def complete_step(msg: func.ServiceBusMessage) -> None:
    s = services()
    try:
        response = AgentResponse.model_validate_json(msg.get_body())
    except ValueError as error:
        log.error("malformed agent response %s ignored: %s", msg.message_id, error)
        return
    dispatch.record(
        response, store=s.store, publisher=s.publisher, now=utcnow(), alerts_queue=s.settings.alerts_queue
    )
