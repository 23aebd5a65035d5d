"""Bindings of the scheduler's functions. No decisions here: parse at the edge, call the
plain functions in ``submission`` and ``dispatch`` with the process's collaborators."""

from __future__ import annotations

import inspect

import azure.functions as func

from adapters import telemetry
from adapters.wiring import Services, parse_or_drop, services
from core import claims, names
from core.models import AgentResponse, Nudge, utcnow
from core.workflow import CURRENT
from scheduler import cancellation, dispatch, events, submission

bp = func.Blueprint()


def scheduler(s: Services) -> dispatch.Scheduler:
    return dispatch.Scheduler(
        store=s.store,
        publisher=s.publisher,
        instance=s.instance,
        defaults=s.settings.step_defaults(),
        requests_queues=s.settings.requests_queues,
        responses_queue=s.settings.agent_responses_queue,
        alerts_queue=s.settings.alerts_queue,
        nudger=s.nudger,
        pending_timeout=s.settings.pending_timeout,
        max_postponements=s.settings.max_postponements,
        cache=s.cache,
    )


#: The submission's nudge leaves through a storage-queue output binding, one per scheduler
#: queue (a binding names one queue; the function sets only its order's). The Functions host
#: sends it once the function returned, and a message that an output binding of an instance
#: sends wakes that instance's own listener of the queue at once, where a send through the
#: SDK waits for the listener's next poll: at light load up to host.json maxPollingInterval
#: (README, "How it works"; tools/funchost/README.md cites the host's source). The wake-up
#: reaches only the instance that sent it: on Flex Consumption, where each function scales on
#: instances of its own, the nudge waits for the scheduler's next poll as before (docs/scale.md).
NUDGE_OUTPUTS: tuple[str, ...] = tuple(f"nudge_{shard}" for shard, _ in enumerate(names.SCHEDULER_QUEUES))


def with_nudge_outputs(function):
    """``function(msg, **nudges)`` with one ``func.Out[str]`` per scheduler queue, bound to that
    queue. The worker finds a function's parameters in its signature and their types in its
    type hints: both name every output."""
    out = func.Out[str]
    function.__signature__ = inspect.Signature(
        [inspect.Parameter("msg", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=func.ServiceBusMessage)]
        + [inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, annotation=out) for arg in NUDGE_OUTPUTS],
        return_annotation=None,
    )
    function.__annotations__ = {"msg": func.ServiceBusMessage, **{arg: out for arg in NUDGE_OUTPUTS}, "return": None}
    for arg, (_, setting) in zip(NUDGE_OUTPUTS, names.SCHEDULER_QUEUES, strict=True):
        function = bp.queue_output(arg_name=arg, queue_name=f"%{setting}%", connection=names.STORAGE_CONNECTION)(
            function
        )
    return function


@bp.function_name("submit_order")
# data_type binary: the function gets the body's bytes as sent, and the host merges none of
# a JSON body's top-level fields into the message's properties (a body's "ReplyTo" would
# otherwise become the message's ReplyTo; tools/funchost/README.md has the sources).
@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=f"%{names.ORDERS_QUEUE_SETTING}%", connection=names.SERVICEBUS_CONNECTION,
    data_type=func.DataType.BINARY,
)
@with_nudge_outputs
def submit_order(msg: func.ServiceBusMessage, **nudges: func.Out[str]) -> None:
    s = services()
    # The client's trace context (traceparent, or Diagnostic-Id) is the order trace's parent.
    with telemetry.entry(names.SPAN_SUBMIT, telemetry.parent_from_properties(msg.application_properties)):
        result = submission.submit(
            msg.get_body(),
            message_id=msg.message_id,
            reply_to=msg.reply_to,
            content_type=msg.content_type,
            own_queues=s.settings.own_queues(),
            store=s.store,
            rejections=s.rejections,
            publisher=s.publisher,
            workflow=CURRENT,
            now=utcnow(),
            pending_timeout=s.settings.pending_timeout,
            trace_parent=telemetry.traceparent(),
            cache=s.cache,
        )
        if result.nudge is not None:
            # To the order's own scheduler queue, sent by the host after the rows (written
            # above) and only if the function returns: raising sends nothing, Service Bus
            # delivers the order again, and the submission, idempotent, nudges again.
            shard = names.scheduler_queue_shard(result.nudge.order_id)
            nudges[NUDGE_OUTPUTS[shard]].set(s.nudger.body(result.nudge))
            s.nudger.sent()


def handle_nudge(msg: func.QueueMessage) -> None:
    # A nudge that cannot be acted on (malformed, or claiming what the app never sends) is
    # dropped with a log line and counted: that loses no order (the supervisor re-nudges
    # every Pending row whose deadline passes). docs/failure-handling.md.
    nudge = parse_or_drop(Nudge, msg.get_body(), what="nudge", message_id=msg.id, check=claims.check_nudge)
    if nudge is not None:
        s = services()
        with telemetry.entry(names.SPAN_SCHEDULE, dispatch.trace_parent_of(nudge), order_id=nudge.order_id):
            dispatch.schedule(nudge, scheduler=scheduler(s), now=utcnow())


def bind_queue(blueprint: func.Blueprint, function_name: str, setting: str, schedule) -> None:
    """Register ``schedule`` as ``function_name``, triggered by the storage queue ``%setting%`` names."""
    schedule.__name__ = schedule.__qualname__ = function_name
    blueprint.function_name(function_name)(
        blueprint.queue_trigger(arg_name="msg", queue_name=f"%{setting}%", connection=names.STORAGE_CONNECTION)(
            schedule
        )
    )


def _register(function_name: str, setting: str) -> None:
    def schedule_order(msg: func.QueueMessage) -> None:
        handle_nudge(msg)

    bind_queue(bp, function_name, setting, schedule_order)


# One function per scheduler queue (names.SCHEDULER_QUEUES), so each queue is read, and
# scaled, on its own; and ``schedule_order`` on the single queue of before the sharding,
# which nothing sends to any more: it drains what an upgrade found there (docs/scale.md).
for _shard, (_, _setting_name) in enumerate(names.SCHEDULER_QUEUES):
    _register(names.schedule_function(_shard), _setting_name)
_register(names.SCHEDULE_FUNCTION, names.SCHEDULER_QUEUE_SETTING)


@bp.function_name("complete_step")
@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=f"%{names.AGENT_RESPONSES_QUEUE_SETTING}%", connection=names.SERVICEBUS_CONNECTION,
    data_type=func.DataType.BINARY,
)
def complete_step(msg: func.ServiceBusMessage) -> None:
    # The same rule as for nudges: a response that cannot be acted on is dropped and counted;
    # the line it names (if any) times out and the supervisor runs it again.
    response = parse_or_drop(
        AgentResponse, msg.get_body(), what="agent_response", message_id=msg.message_id, check=claims.check_response
    )
    if response is not None:
        s = services()
        parent = telemetry.parent_from_properties(msg.application_properties) or dispatch.trace_parent_of(response)
        with telemetry.entry(
            names.SPAN_RECORD, parent, order_id=response.order_id, step=response.step, kind=response.kind,
            attempt=response.attempt, outcome=response.outcome,
        ):
            dispatch.record(response, scheduler=scheduler(s), now=utcnow())


@bp.function_name("receive_order_event")
@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=f"%{names.ORDER_EVENTS_QUEUE_SETTING}%", connection=names.SERVICEBUS_CONNECTION,
    data_type=func.DataType.BINARY,
)
def receive_order_event(msg: func.ServiceBusMessage) -> None:
    # An external event for a waiting step, from any client (docs/clients.md, "Sending order events").
    # As for orders: an invalid or refused event is kept in the rejections table and completed.
    # Its span (order.event) joins the order's trace (scheduler/events.py).
    s = services()
    events.receive_message(
        msg.get_body(), message_id=msg.message_id, content_type=msg.content_type, scheduler=scheduler(s),
        rejections=s.rejections, now=utcnow(),
    )


@bp.function_name("cancel_order")
@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=f"%{names.CANCELLATIONS_QUEUE_SETTING}%", connection=names.SERVICEBUS_CONNECTION,
    data_type=func.DataType.BINARY,
)
def cancel_order(msg: func.ServiceBusMessage) -> None:
    # A client's request, as for orders: one that cannot be acted on is kept in rejections
    # with its reason and completes (scheduler/cancellation.py); storage down raises (redelivered).
    s = services()
    cancellation.cancel_message(
        msg.get_body(), message_id=msg.message_id, content_type=msg.content_type, store=s.store,
        rejections=s.rejections, publisher=s.publisher, nudger=s.nudger, now=utcnow(),
    )
