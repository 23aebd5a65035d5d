"""Order submission: validate an ``orders`` message and write it, or keep it as a rejection.

A message is never retried in a loop for being invalid: it is kept whole, with the
reason, in the rejections table and completed. Only a failure to write (storage
unavailable) raises, so Service Bus delivers the message again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from pydantic import ValidationError

from adapters import search, telemetry
from adapters.messaging import Publisher
from adapters.order_cache import OrderCache
from core.models import Nudge, OrderRequest, ProcessState, Status, StatusEvent, explain, queue_key
from core.workflow import Workflow, latest
from adapters.store import OrderConflict, RejectionStore, StateStore

log = logging.getLogger(__name__)

#: Service Bus queue names: letters, digits, periods, hyphens, underscores, slashes; up to 260.
_QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,259}")


def _queue_name(text: str) -> bool:
    """A name a ReplyTo may give: the whole text (a final newline too) of queue-name
    characters, and no empty, ``.`` or ``..`` path segment (no trailing slash: "cannot start
    or end with a slash", ``QueueProperties.Name``; a dot segment could resolve to another
    queue, one of the app's own among them)."""
    return _QUEUE_NAME.fullmatch(text) is not None and not any(
        segment in ("", ".", "..") for segment in text.split("/")
    )
#: The one content type the orders queue takes (with parameters such as charset).
JSON_CONTENT_TYPE = "application/json"
#: Orders up to this size ride along in the scheduler's nudge (saving a table read).
MAX_NUDGE_DOCUMENT_BYTES = 32 * 1024


class Result(str, Enum):
    CREATED = "created"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Submission:
    result: Result
    order_id: str | None = None
    #: What the scheduler should be nudged with, if anything.
    nudge: Nudge | None = None
    reason: str | None = None


def _content_type_ok(content_type: str | None) -> bool:
    if not content_type:
        return True  # many clients (and the portal) send none: the body must still be JSON
    return content_type.split(";")[0].strip().lower() == JSON_CONTENT_TYPE


def _text(value: object) -> str | None:
    """A broker property as text. Any client may set message id, content type or ReplyTo
    to a non-string AMQP value (a UUID, a number, binary): never a reason to fail."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _shown(text: str | None, limit: int = 100) -> str | None:
    """A client's text as logs and reasons show it: clipped, with its length."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def _claimed_order_id(body: bytes) -> str | None:
    """The order id an invalid order claims, if it has one (to correlate the rejection)."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested too deep (the corpus has 10,000 levels)
        return None
    claimed = document.get("order_id") if isinstance(document, dict) else None
    return claimed if isinstance(claimed, str) else None


def submit(
    body: bytes,
    *,
    message_id: object,
    reply_to: object,
    content_type: object,
    own_queues: frozenset[str] = frozenset(),
    store: StateStore,
    rejections: RejectionStore,
    publisher: Publisher,
    workflow: Workflow,
    now: datetime,
    pending_timeout: timedelta,
    trace_parent: str | None = None,
    cache: OrderCache | None = None,
) -> Submission:
    """``workflow``: what an order that names none runs on. ``own_queues``: the app's own queues, which a ReplyTo may not name (status events
    would land among alerts, orders or agent requests). ``trace_parent``: the submission's
    trace context, kept on a new order's state row (its resets and resubmits continue it).
    ``cache``: the process's orders as it last wrote them, where a new order goes, so its
    first claim here is decided on its rows as written (scheduler/dispatch.py)."""
    result = _submit(
        body, message_id=message_id, reply_to=reply_to, content_type=content_type, own_queues=own_queues, store=store,
        rejections=rejections, publisher=publisher, workflow=workflow, now=now, pending_timeout=pending_timeout,
        trace_parent=trace_parent, cache=cache,
    )
    telemetry.order_submitted(result.result.value)
    telemetry.annotate(order_id=result.order_id, outcome=result.result)
    return result


def _submit(
    body: bytes,
    *,
    message_id: object,
    reply_to: object,
    content_type: object,
    own_queues: frozenset[str],
    store: StateStore,
    rejections: RejectionStore,
    publisher: Publisher,
    workflow: Workflow,
    now: datetime,
    pending_timeout: timedelta,
    trace_parent: str | None,
    cache: OrderCache | None,
) -> Submission:
    message_id, reply_to, content_type = _text(message_id), _text(reply_to), _text(content_type)

    def reject(reason: str, order_id: str | None = None) -> Submission:
        rejections.add(
            body=body, reason=reason, now=now, message_id=message_id, content_type=content_type, order_id=order_id
        )
        log.warning("order message %s rejected: %s", _shown(message_id), reason)
        # Tell the submitter, if it named a queue we may write to (best effort).
        queue = reply_to if reply_to and _queue_name(reply_to) and not _own(reply_to) else None
        publisher.send_status(
            StatusEvent(
                order_id=(order_id or _claimed_order_id(body) or message_id or "unknown")[:100],
                status=Status.REJECTED, time=now, detail=reason,
            ),
            queue=queue,
            # Which message was rejected: the same one redelivered has the same event id, another one not.
            key=hashlib.sha256(message_id.encode() if message_id else body).hexdigest()[:16],
        )
        return Submission(Result.REJECTED, order_id, reason=reason)

    def _own(queue: str) -> bool:
        # As the broker resolves names: "alerts/", "ALERTS" and "ns.servicebus.windows.net/alerts" are all alerts.
        return queue_key(queue) in {queue_key(own) for own in own_queues}

    if not _content_type_ok(content_type):
        return reject(f"unsupported content type {_shown(content_type)!r}: send the order as {JSON_CONTENT_TYPE}")
    try:
        order = OrderRequest.model_validate_json(body)
    except ValidationError as error:
        return reject(f"invalid order: {explain(error)}")
    except ValueError as error:  # e.g. bytes that are not UTF-8
        return reject(f"malformed order: {error}")

    note = None
    if reply_to and _own(reply_to):  # first: "alerts/" is no queue name as written, but the broker's alerts
        note = f"ReplyTo {_shown(reply_to)!r} ignored: it names one of the app's own queues; no status events are sent"
    elif reply_to and not _queue_name(reply_to):
        note = f"ReplyTo {_shown(reply_to)!r} ignored: not a valid queue name; no status events are sent"
    if note:
        log.warning("order %s: %s", order.order_id, note)
        reply_to = None

    search.index_customer(store, order, now)  # before the order's transaction (adapters/search.py)
    # The order's own "workflow" field (validated by the model: a name the app has) picks
    # the newest version of that workflow; without it, the default (docs/workflows.md).
    chosen = latest(order.workflow) if order.workflow else workflow
    try:
        created = store.create_order(
            order, workflow=chosen, reply_to=reply_to, now=now, pending_timeout=pending_timeout, note=note,
            trace_parent=trace_parent,
        )
    except OrderConflict:
        return reject(
            f"order id {order.order_id!r} already exists with different content; the original is unchanged",
            order.order_id,
        )

    state = created.state
    if created.record is not None and cache is not None:
        cache.put(created.record, now)
    if created.created:
        publisher.send_status(
            StatusEvent(order_id=order.order_id, status=Status.RECEIVED, time=now), queue=reply_to
        )
        document = order.document()
        # A storage-queue message holds 64 KiB after base64; a larger order travels
        # without its document and the scheduler reads it from the table instead.
        if len(document.encode()) > MAX_NUDGE_DOCUMENT_BYTES:
            document = None
        return Submission(Result.CREATED, order.order_id, Nudge(order_id=order.order_id, state=state, document=document))
    # The same order again. If it is still Pending, the first delivery may have died
    # before its nudge went out: nudge again (a claim is ETag-guarded, so a second
    # nudge is harmless).
    log.info("order %s: duplicate submission, nothing written", order.order_id)
    nudge = Nudge(order_id=order.order_id, state=state) if state.process_state is ProcessState.PENDING else None
    return Submission(Result.DUPLICATE, order.order_id, nudge)
