"""A small app with one function per trigger and output kind, for the local host's tests.

``sb_record``, ``queue_sync`` and the timers are plain (sync) functions: the worker runs
them on its one shared thread pool; ``queue_record`` is ``async def``: its event loop.

Every invocation appends a JSON line to ``$FH_RECORD_DIR/<instance id>.jsonl`` so a
test can see what each host process received. The message body steers the function:
``{"fail": true}`` raises (after setting the outputs), ``{"sleep": 2}`` sleeps first,
``{"sleep_first": 30}`` sleeps on the first delivery only, ``{"out": "text"}`` sets
the outputs, ``{"crash": true}`` (``{"crash_first": true}``: on the first delivery only)
ends the worker process where it stands. Queue names and the schedule are app settings
(``%FH_...%``); a test switches off what it does not need with
``AzureWebJobs.<name>.Disabled``.
"""

import asyncio
import itertools
import json
import logging
import os
import threading
import time
from datetime import UTC, datetime

import azure.functions as func

app = func.FunctionApp()
log = logging.getLogger("funchost.tests.app")
_lock = threading.Lock()


def record(function: str, event: str, **fields) -> None:
    line = {
        "function": function,
        "event": event,
        "instance": os.environ["WEBSITE_INSTANCE_ID"],
        "pid": os.getpid(),
        "at": datetime.now(UTC).isoformat(),
        **fields,
    }
    path = os.path.join(os.environ["FH_RECORD_DIR"], os.environ["WEBSITE_INSTANCE_ID"] + ".jsonl")
    with _lock, open(path, "a", encoding="utf-8") as file:
        file.write(json.dumps(line, default=str) + "\n")


def _iso(value):
    return value.isoformat() if value else None


def _command(body: bytes) -> dict:
    try:
        command = json.loads(body)
    except ValueError:
        return {}
    return command if isinstance(command, dict) else {}


@app.service_bus_queue_trigger(arg_name="msg", queue_name="%FH_SB_QUEUE%", connection="ServiceBusConnection")
@app.queue_output(arg_name="to_queue", queue_name="%FH_OUT_QUEUE%", connection="AzureWebJobsStorage")
@app.service_bus_queue_output(arg_name="to_bus", queue_name="%FH_SB_OUT_QUEUE%", connection="ServiceBusConnection")
def sb_record(msg: func.ServiceBusMessage, to_queue: func.Out[str], to_bus: func.Out[str]) -> None:
    body = msg.get_body()
    command = _command(body)
    record(
        "sb_record",
        "start",
        body=body.decode("utf-8", "replace"),
        body_hex=body.hex(),
        type=type(msg).__name__,
        message_id=msg.message_id,
        correlation_id=msg.correlation_id,
        reply_to=msg.reply_to,
        content_type=msg.content_type,
        subject=msg.subject,
        label=msg.label,
        to=msg.to,
        session_id=msg.session_id,
        reply_to_session_id=msg.reply_to_session_id,
        partition_key=msg.partition_key,
        transaction_partition_key=msg.transaction_partition_key,
        dead_letter_source=msg.dead_letter_source,
        delivery_count=msg.delivery_count,
        sequence_number=msg.sequence_number,
        enqueued_time_utc=_iso(msg.enqueued_time_utc),
        enqueued_time_is_naive=msg.enqueued_time_utc is not None and msg.enqueued_time_utc.tzinfo is None,
        expires_at_utc=_iso(msg.expires_at_utc),
        locked_until=_iso(msg.locked_until),
        lock_token=msg.lock_token,
        time_to_live=msg.time_to_live.total_seconds() if msg.time_to_live else None,
        application_properties=msg.application_properties,
        user_properties=msg.user_properties,
        metadata_message_id=(msg.metadata or {}).get("MessageId"),
        metadata=msg.metadata,
        thread=threading.current_thread().name,
    )
    if command.get("crash") or (command.get("crash_first") and msg.delivery_count == 1):
        os._exit(3)  # the worker process dies mid-invocation, as a crash would
    if "sleep" in command:
        time.sleep(float(command["sleep"]))
    if "sleep_first" in command and msg.delivery_count == 1:
        time.sleep(float(command["sleep_first"]))
    if "out" in command:
        to_queue.set(command["out"])
        to_bus.set(command["out"])
    if command.get("fail"):
        record("sb_record", "fail", message_id=msg.message_id, delivery_count=msg.delivery_count)
        raise RuntimeError(f"failing on purpose (delivery {msg.delivery_count})")
    record("sb_record", "done", message_id=msg.message_id)


@app.queue_trigger(arg_name="msg", queue_name="%FH_QUEUE%", connection="AzureWebJobsStorage")
@app.queue_output(arg_name="$return", queue_name="%FH_QUEUE_OUT%", connection="AzureWebJobsStorage")
async def queue_record(msg: func.QueueMessage, context: func.Context) -> str:
    body = msg.get_body()
    command = _command(body)
    record(
        "queue_record",
        "start",
        body=body.decode("utf-8", "replace"),
        type=type(msg).__name__,
        id=msg.id,
        dequeue_count=msg.dequeue_count,
        insertion_time=_iso(msg.insertion_time),
        expiration_time=_iso(msg.expiration_time),
        pop_receipt=msg.pop_receipt,
        invocation_id=context.invocation_id,
        function_name=context.function_name,
        thread=threading.current_thread().name,
    )
    if "sleep" in command:
        await asyncio.sleep(float(command["sleep"]))
    if "sleep_first" in command and msg.dequeue_count == 1:
        await asyncio.sleep(float(command["sleep_first"]))
    if command.get("fail"):
        record("queue_record", "fail", id=msg.id, dequeue_count=msg.dequeue_count)
        raise RuntimeError(f"failing on purpose (dequeue {msg.dequeue_count})")
    record("queue_record", "done", id=msg.id)
    # Never None: Microsoft's runtime cannot encode None for a queue output, and fails the invocation.
    return command.get("out", "")


@app.queue_trigger(arg_name="msg", queue_name="%FH_SYNC_QUEUE%", connection="AzureWebJobsStorage")
def queue_sync(msg: func.QueueMessage) -> None:
    """A plain storage-queue function: ``{"sleep": s}`` holds a thread of the worker's pool."""
    command = _command(msg.get_body())
    record(
        "queue_sync", "start", id=msg.id, dequeue_count=msg.dequeue_count, thread=threading.current_thread().name
    )
    if "sleep" in command:
        time.sleep(float(command["sleep"]))
    record("queue_sync", "done", id=msg.id)


@app.timer_trigger(arg_name="timer", schedule="%FH_TIMER_SCHEDULE%", use_monitor=False)
def tick(timer: func.TimerRequest) -> None:
    record("tick", "start", past_due=timer.past_due, type=type(timer).__name__)
    log.info("tick")


@app.timer_trigger(arg_name="timer", schedule="0 0 0 1 1 *", run_on_startup=True)
def tick_on_startup(timer: func.TimerRequest) -> None:
    record("tick_on_startup", "start", past_due=timer.past_due)


_slow_runs = itertools.count()


@app.timer_trigger(arg_name="timer", schedule="%FH_TIMER_SCHEDULE%", use_monitor=False)
def slow_tick(timer: func.TimerRequest) -> None:
    """Its first run outlasts the schedule's interval (FH_SLOW_TICK_SECONDS); the rest are quick."""
    first = next(_slow_runs) == 0
    record("slow_tick", "start", past_due=timer.past_due)
    if first:
        time.sleep(float(os.environ["FH_SLOW_TICK_SECONDS"]))
    record("slow_tick", "done")
