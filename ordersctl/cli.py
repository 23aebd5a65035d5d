"""Commands: send-order, watch-status, status, list, breakers, alerts, dead-letters, rejections, errors,
backfill-customers, resubmit, stamp, approve, reject, cancel, archive show.

Exit codes: 0 success, 1 a clear failure (not found, refused, invalid, unreachable: one
``error: ...`` line on stderr), 2 usage.
"""

from __future__ import annotations

import json
import os
import re
import traceback
from decimal import Decimal
from pathlib import Path
from typing import Annotated

import typer
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from adapters.settings import Settings
from core import names
from core.models import Alert, Money, OrderRequest, ProcessState, explain, utcnow
from core.progress import status_document
from core.retention import BadDay, parse_day

#: The summary ``ordersctl --help`` shows above its list of commands.
HELP = ("The order app's command line for operators and clients: send orders and approval events, follow and "
        "show orders, list, resubmit and cancel them, read alerts, dead letters, rejections, circuit breakers "
        "and the archive. Exit codes: 0 success, 1 a clear failure, 2 usage.")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=HELP)
out = Console()
err = Console(stderr=True)

SettingsFile = Annotated[
    Path | None,
    typer.Option("--settings", help="A local.settings.json whose Values fill in unset environment variables."),
]
Stamps = Annotated[
    str | None,
    typer.Option("--stamps", envvar=names.ORDERS_STAMPS_SETTING,
                 help="With stamps (docs/scale.md): their Service Bus namespaces, comma-separated in stamp order."),
]


def say_error(message: str) -> None:
    """One ``error: ...`` line on stderr: never wrapped, never read as markup (an order id
    or a service's message may hold ``[...]``)."""
    line = " ".join(str(message).split())
    err.print(Text.assemble(("error:", "red"), " ", line), soft_wrap=True, highlight=False)


def fail(message: str) -> typer.Exit:
    say_error(message)
    return typer.Exit(code=1)


def load_settings(path: Path | None) -> Settings:
    """Settings as the app reads them.

    ``--settings FILE`` fills unset environment variables from the file's Values. With
    no ``--settings``, ``local.settings.json`` in this folder is read only when the
    environment names no connection at all: connections exported for Azure (for
    example ``AzureWebJobsStorage__accountName``) are never mixed with the local stack's.
    """
    given = path is not None
    if path is None and Path("local.settings.json").exists() and not _connection_in_environment():
        path = Path("local.settings.json")
    if path is not None:
        try:
            values = _settings_values(path)
        except ValueError as error:
            if given:  # what the operator typed: a usage error
                raise typer.BadParameter(str(error), param_hint="'--settings'") from None
            raise fail(str(error)) from None
        for key, value in values.items():
            os.environ.setdefault(key, str(value))
    try:
        return Settings()
    except ValidationError as error:
        raise fail(f"settings: {explain(error)}") from error


def _settings_values(path: Path) -> dict:
    """The ``Values`` of a settings file; ValueError naming the file and what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"cannot read settings file {str(path)!r}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ValueError(f"settings file {str(path)!r} is not UTF-8 text") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"settings file {str(path)!r} is not JSON: {error}") from None
    values = document.get("Values", {}) if isinstance(document, dict) else None
    if not isinstance(values, dict):
        raise ValueError(f"settings file {str(path)!r} is not a local.settings.json: "
                         'expected {"Values": {"NAME": "value", ...}}')
    return values


def _connection_in_environment() -> bool:
    prefixes = (names.STORAGE_CONNECTION, names.STATE_STORAGE_CONNECTION, names.SERVICEBUS_CONNECTION)
    return any(key.startswith(prefixes) for key in os.environ)


class Context:
    """Clients built on first use, so `--help` and usage errors need no connection."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._services = None

    @property
    def services(self):
        if self._services is None:
            from adapters.accounts import AccountLayoutChanged
            from adapters.wiring import Services

            try:
                self._services = Services.from_settings(self.settings)
            except AccountLayoutChanged as error:
                raise fail(str(error)) from None
        return self._services

    def servicebus(self):
        from adapters import clients

        return clients.servicebus_client(self.settings)


def _context(settings: Path | None) -> Context:
    return Context(load_settings(settings))


def _parse_item(text: str) -> dict:
    """``SKU:QUANTITY:UNIT_PRICE``, the price as the order's money (digits, at most two
    decimals); a usage error naming the item otherwise, before anything is connected."""
    try:
        sku, quantity, price = text.split(":")
        TypeAdapter(Money).validate_python(price)
        return {"sku": sku, "quantity": int(quantity), "unit_price": price}
    except ValueError as error:  # a pydantic ValidationError is a ValueError too
        raise typer.BadParameter(f"{text!r}: expected SKU:QUANTITY:UNIT_PRICE with a price such as 12.50, "
                                 "e.g. sku-1:2:12.50", param_hint="'--item'") from None


@app.command("send-order")
def send_order(
    file: Annotated[Path | None, typer.Option("--file", "-f", help="An order as JSON (see schemas/order.schema.json).")] = None,
    order_id: Annotated[
        str | None, typer.Option(help="Order id (the message id is it + ':' + a hash of the body).")
    ] = None,
    customer: Annotated[str | None, typer.Option(help="Customer id.")] = None,
    item: Annotated[list[str] | None, typer.Option(help="SKU:QUANTITY:UNIT_PRICE; repeat for more lines.")] = None,
    currency: Annotated[str, typer.Option(help="ISO 4217 currency.")] = "EUR",
    reply_to: Annotated[str | None, typer.Option("--reply-to", help="A queue to receive status events.")] = None,
    workflow: Annotated[
        str | None, typer.Option(help="The workflow to run (order-approval, order-parallel); default: the order workflow.")
    ] = None,
    settings: SettingsFile = None,
    stamps: Stamps = None,
) -> None:
    """Validate an order against the model and send it to the orders queue, with
    MessageId = the order id + ':' + the first 16 hex digits of the body's SHA-256.
    With --stamps (or ORDERS_STAMPS), an order whose stamp the settings do not reach is refused."""
    if file is not None:
        try:
            body = file.read_bytes()
        except OSError as error:
            raise typer.BadParameter(f"cannot read {str(file)!r}: {error.strerror or error}",
                                     param_hint="'--file'") from None
    else:
        if not (order_id and customer and item):
            raise typer.BadParameter("give --file, or --order-id, --customer and at least one --item")
        lines = [_parse_item(text) for text in item]
        total = sum((Decimal(line["unit_price"]) * line["quantity"] for line in lines), Decimal(0))
        document = {"order_id": order_id, "customer_id": customer, "currency": currency, "items": lines,
                    "total": f"{total:.2f}"}
        body = json.dumps({**document, "workflow": workflow} if workflow else document).encode()
    try:
        order = OrderRequest.model_validate_json(body)
    except ValidationError as error:
        raise fail(f"invalid order, not sent: {explain(error)}") from error
    ctx = _context(settings)
    if stamps:
        from ordersctl.stamps import StampError, check_stamp, connected_namespace, parse_stamps

        try:
            check_stamp(order.order_id, parse_stamps(stamps), connected_namespace(
                ctx.settings.servicebus_connection_string, ctx.settings.servicebus_namespace))
        except StampError as error:
            raise fail(f"not sent: {error}") from error
    from azure.servicebus import ServiceBusMessage

    message = ServiceBusMessage(
        order.document(), content_type="application/json", message_id=order.message_id(), reply_to=reply_to
    )
    with ctx.servicebus() as client, client.get_queue_sender(ctx.settings.orders_queue) as sender:
        sender.send_messages(message)
    out.print(f"sent order [bold]{order.order_id}[/bold] to {ctx.settings.orders_queue}"
              + (f" (status events to {reply_to})" if reply_to else ""))


@app.command("watch-status")
def watch_status(
    queue: Annotated[str, typer.Argument(help="The reply queue named in --reply-to.")],
    timeout: Annotated[float, typer.Option(help="Stop after this many seconds without an event.")] = 30.0,
    count: Annotated[int | None, typer.Option(help="Stop after this many events.")] = None,
    settings: SettingsFile = None,
) -> None:
    """Print status events from a reply queue as they arrive (and remove them)."""
    ctx = _context(settings)
    seen = 0
    with ctx.servicebus() as client, client.get_queue_receiver(queue, max_wait_time=timeout) as receiver:
        for message in receiver:
            event = _status_event(message)
            if event is None:
                # Not a status event (someone else's message on the queue): kept, out of the
                # way (completing it would lose it, leaving it would show it again and again).
                receiver.dead_letter_message(message, reason="not a status event",
                                             error_description="ordersctl watch-status could not read it")
                err.print(f"skipped message {message.message_id!s}: not a status event (a JSON object with "
                          f"order_id, status and time); moved to the dead-letter queue "
                          f"(ordersctl dead-letters {queue})", soft_wrap=True, markup=False, highlight=False)
                continue
            step = f"({event['step']})" if event.get("step") else ""
            line = Text.assemble(f"{event['time']}  {event['order_id']}  ", (str(event["status"]), "bold"),
                                 f"{step}  {event.get('detail') or ''}")
            out.print(line)
            receiver.complete_message(message)
            seen += 1
            if count is not None and seen >= count:
                break
    if seen == 0:
        err.print(f"no status events on {queue} within {timeout:g}s")


def _status_event(message) -> dict | None:
    """A reply queue's message as a status event (core/models.py StatusEvent), or None."""
    try:
        event = json.loads(str(message))
    except (ValueError, TypeError, RecursionError):  # not JSON, not text
        return None
    if not isinstance(event, dict) or not all(isinstance(event.get(k), str) for k in ("order_id", "status", "time")):
        return None
    return event


def _ago(when) -> str:
    left = (when - utcnow()).total_seconds()
    return "in %.0fs" % left if left >= 0 else "%.0fs ago" % -left


@app.command()
def status(
    order_id: Annotated[str, typer.Argument(help="The order id.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object (for scripts).")] = False,
    settings: SettingsFile = None,
) -> None:
    """Show an order: its state, and every step and compensation (state, attempt,
    failures, last error, result)."""
    from adapters.store import OrderNotFound

    ctx = _context(settings)
    try:
        record = ctx.services.store.read(order_id)
    except OrderNotFound as error:
        raise fail(str(error)) from error
    document = status_document(record.state, record.document, record.lines)
    if as_json:
        print(json.dumps(document, indent=2))
        return
    state, order, steps = record.state, document["order"], document["steps"]
    table = Table(show_header=False, box=None)
    rows = [
        ("order", state.order_id),
        ("state", state.process_state.value + (" (undoing)" if state.compensating and not state.process_state.terminal else "")),
        ("workflow", f"{state.workflow} v{state.workflow_version}"),
        ("customer", order["customer_id"]),
        ("items / total", f"{len(order['items'])} / {order['total']} {order['currency']}"),
        ("attempt", str(state.attempt)),
        ("locked by", state.locked_by or "-"),
        ("complete by", f"{state.complete_by.isoformat()} ({_ago(state.complete_by)})"),
        ("last error", state.last_error or "-"),
        ("undone because", state.cause or "-"),
        ("waiting for", f"{document['waiting']['event']} until {document['waiting']['until']}"
         if document["waiting"] else "-"),
        ("cancel", _cancel_row(document["cancel"])),
        ("reply to", state.reply_to or "-"),
        ("note", state.note or "-"),
        ("created / updated", f"{state.created_at.isoformat()} / {state.updated_at.isoformat()}"),
    ]
    for key, value in rows:
        table.add_row(f"[bold]{key}[/bold]", value)
    out.print(table)
    lines = Table("step", "kind", "action", "state", "attempt", "failures", "last error / result")
    for line in steps:
        if "error" in line:
            lines.add_row(line["error"], "", "", "", "", "", "")
            continue
        detail = line["last_error"] or (json.dumps(line["result"]) if line["result"] else "")
        lines.add_row(line["step"], line["kind"], line["action"] or "-", line["state"],
                      str(line["attempt"] or "-"), str(line["failure_count"]), detail[:48])
    out.print(lines)


def _cancel_row(cancel: dict | None) -> str:
    if cancel is None:
        return "-"
    return f"requested {cancel['requested_at']} by {cancel['by'] or '-'}: {cancel['reason'] or 'no reason given'}"


@app.command("list")
def list_orders(
    state: Annotated[ProcessState, typer.Option(help="Which state to list.", case_sensitive=False)] = ProcessState.ERROR,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Rows per page.")] = 20,
    page: Annotated[int, typer.Option(min=1, help="Page number, newest first.")] = 1,
    customer: Annotated[str | None, typer.Option(help="A customer's orders instead, newest first (JSON, as GET /api/orders?customer=).")] = None,
    since: Annotated[str | None, typer.Option(help="With --customer: created at or after (ISO 8601 with a zone).")] = None,
    until: Annotated[str | None, typer.Option(help="With --customer: created at or before (ISO 8601 with a zone).")] = None,
    continuation: Annotated[str | None, typer.Option(help="With --customer: the continuation of the previous page.")] = None,
    settings: SettingsFile = None,
) -> None:
    """List orders in a state, newest first; or, with --customer, a customer's orders."""
    ctx = _context(settings)
    if customer is not None:
        from ordersctl import search

        search.by_customer(ctx.services, fail, customer=customer, since=since, until=until, limit=limit,
                           continuation=continuation)
        return
    rows = ctx.services.store.list_by_state(state, limit=limit * page)[(page - 1) * limit :]
    table = Table("order", "state", "attempt", "failures", "updated", "last error")
    for row in rows:
        table.add_row(row.order_id, row.process_state.value, str(row.attempt), str(row.failure_count),
                      row.updated_at.isoformat(timespec="seconds"), (row.last_error or "")[:80])
    out.print(table)
    out.print(f"{len(rows)} {state.value} order(s) on page {page}")


@app.command()
def breakers(settings: SettingsFile = None) -> None:
    """The agents' circuit breakers per remote service and host instance, as each host
    last published them (on every state change): which services are being held off."""
    ctx = _context(settings)
    rows = ctx.services.store.breakers()
    table = Table("service", "host instance", "state", "since")
    for row in rows:
        table.add_row(row.service, row.instance, row.state, f"{row.changed_at.isoformat(timespec='seconds')} ({_ago(row.changed_at)})")
    out.print(table)
    held = sorted({row.service for row in rows if row.state != "closed"})
    out.print(f"not closed on some host: {', '.join(held)}" if held else "every published breaker is closed")


def _peek(ctx: Context, queue: str, *, most: int, take: bool):
    from azure.servicebus import ServiceBusReceiveMode

    with ctx.servicebus() as client:
        mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE if take else ServiceBusReceiveMode.PEEK_LOCK
        with client.get_queue_receiver(queue, receive_mode=mode, max_wait_time=2) as receiver:
            if take:
                return receiver.receive_messages(max_message_count=most, max_wait_time=2)
            return receiver.peek_messages(max_message_count=most)


@app.command()
def alerts(
    most: Annotated[int, typer.Option("--max", min=1, help="How many to show.")] = 50,
    take: Annotated[bool, typer.Option("--take", help="Remove them from the queue (default: peek).")] = False,
    settings: SettingsFile = None,
) -> None:
    """Show operator alerts (orders that ended in Error)."""
    ctx = _context(settings)
    messages = _peek(ctx, ctx.settings.alerts_queue, most=most, take=take)
    table = Table("time", "order", "could not undo", "last error")
    for message in messages:
        try:
            alert = Alert.model_validate_json(str(message))
        except ValueError:
            # Not one of ours (someone else's message on the queue): shown, never a crash.
            table.add_row(str(message.enqueued_time_utc or "-"), "(not an alert)", "-", str(message)[:100])
            continue
        table.add_row(alert.time.isoformat(), alert.order_id, ", ".join(alert.failed_compensations) or "-",
                      (alert.last_error or "")[:100])
    out.print(table)
    out.print(f"{len(messages)} alert(s)" + (" taken" if take else " (peeked; --take removes them)"))


@app.command("dead-letters")
def dead_letters(
    queue: Annotated[str, typer.Argument(help="The queue whose dead-letter queue to show.")],
    most: Annotated[int, typer.Option("--max", min=1)] = 50,
    settings: SettingsFile = None,
) -> None:
    """Show dead-lettered messages of a queue with their reasons (peek). A part of a message
    the Azure SDK cannot decode (e.g. an AMQP decimal128 property) is skipped and named."""
    from azure.servicebus import ServiceBusSubQueue

    from ordersctl.peek import peek

    ctx = _context(settings)
    with ctx.servicebus() as client:
        with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
            peeked = peek(receiver, most)
    table = Table("seq", "message id", "reason", "description", "body")
    for n, item in enumerate(peeked, start=1):
        message = item.message
        if message is None:
            table.add_row("?", f"(message {n} of the peek: undecodable)", "", "", "")
            continue
        table.add_row(str(message.sequence_number or "?"), str(message.message_id),
                      str(message.dead_letter_reason or ""), str(message.dead_letter_error_description or "")[:80],
                      _shown_body(message)[:60])
    out.print(table)
    skipped = sum(len(item.skipped) for item in peeked)
    out.print(f"{len(peeked)} dead-lettered message(s) on {queue}"
              + (f"; {skipped} part(s) the Azure SDK cannot decode were skipped (listed on stderr)" if skipped else ""))
    for n, item in enumerate(peeked, start=1):
        which = _which(item.message, n)
        for part in item.skipped:
            err.print(f"skipped in {which}: {part.part}: {part.why}", soft_wrap=True, markup=False, highlight=False)


def _which(message, n: int) -> str:
    """A peeked message as an operator finds it again: its id and sequence number, as far as known."""
    if message is None:
        return f"message {n} of the peek"
    number = f"sequence number {message.sequence_number}" if message.sequence_number else f"number {n} of the peek"
    return f"message {message.message_id!s} ({number})" if message.message_id is not None else f"message at {number}"


def _shown_body(message) -> str:
    try:
        return str(message)
    except Exception as error:  # noqa: BLE001 - a body of any type is shown, never a crash
        return f"({type(error).__name__})"


@app.command()
def rejections(
    day: Annotated[str | None, typer.Option(help="UTC day YYYY-MM-DD (default: all).")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 20,
    settings: SettingsFile = None,
) -> None:
    """Show order and order-event messages that were refused, with the reason, newest first."""
    if day is not None:
        try:  # checked before any connection, as `archive show` checks its day
            parse_day(day)
        except BadDay as error:
            raise fail(str(error)) from error
    ctx = _context(settings)
    rows = ctx.services.rejections.list(day=day, limit=limit)
    table = Table("rejected at", "message id", "reason", "body")
    for row in rows:
        table.add_row(row["RejectedAt"].isoformat(timespec="seconds"), row["MessageId"], row["Reason"][:100],
                      row["Body"][:60].decode("utf-8", errors="replace"))
    out.print(table)


@app.command()
def errors(
    limit: Annotated[int, typer.Option(min=1, max=100, help="Groups per page.")] = 20,
    continuation: Annotated[str | None, typer.Option(help="The continuation of the previous page.")] = None,
    settings: SettingsFile = None,
) -> None:
    """The orders in Error grouped by cause (the step or undo, and the normalised last
    error), with counts and a sample: JSON, as GET /api/errors."""
    from ordersctl import search

    search.errors(_context(settings).services, fail, limit=limit, continuation=continuation)


@app.command("backfill-customers")
def backfill_customers(settings: SettingsFile = None) -> None:
    """Index by customer the orders submitted before the customer index existed (a one-off
    scan of every order; idempotent), so `list --customer` finds them too."""
    from adapters.search import backfill_customers as backfill

    out.print(f"{backfill(_context(settings).services.store)} order(s) indexed by customer")


@app.command()
def resubmit(
    order_id: Annotated[str | None, typer.Argument(help="An order in Error.")] = None,
    group: Annotated[str | None, typer.Option(help="Every order of this error group instead (ordersctl errors).")] = None,
    settings: SettingsFile = None,
) -> None:
    """Send an order in Error back where it stopped (the stopped step, or the undos that
    failed), failure count cleared, and nudge the scheduler. Done steps are not redone.
    With --group: every order of that cause, at BULK_RESUBMIT_PER_SECOND (one JSON line per batch)."""
    from adapters.store import OrderNotFound
    from supervisor.supervision import NotResubmittable
    from supervisor.supervision import resubmit as do_resubmit

    if (order_id is None) == (group is None):
        raise typer.BadParameter("give an ORDER_ID or --group GROUP (not both)")
    ctx = _context(settings)
    s = ctx.services
    if group is not None:
        from ordersctl import search

        search.resubmit_group(s, fail, group=group)
        return
    try:
        state = do_resubmit(order_id, store=s.store, nudger=s.nudger, now=utcnow(), pending_timeout=s.settings.pending_timeout)
    except (OrderNotFound, NotResubmittable) as error:
        raise fail(str(error)) from error
    out.print(f"order [bold]{order_id}[/bold] resubmitted: {state.process_state.value}, next attempt {state.attempt + 1}")


@app.command()
def stamp(
    order_ids: Annotated[list[str], typer.Argument(help="Order ids.")],
    stamps: Stamps = None,
) -> None:
    """Which stamp each order belongs to (core/names.py stamp_of), with its namespace: run
    the other commands with that stamp's settings. Needs --stamps or ORDERS_STAMPS."""
    from ordersctl.stamps import StampError, parse_stamps, stamp_for

    if not stamps:
        raise typer.BadParameter(f"give --stamps or set {names.ORDERS_STAMPS_SETTING} (the stamps' namespaces, "
                                 f"comma-separated in stamp order)")
    try:
        listed = parse_stamps(stamps)
    except StampError as error:
        raise fail(str(error)) from error
    for order_id in order_ids:
        index, namespace = stamp_for(order_id, listed)
        out.print(f"{order_id}  stamp {index}  {namespace}")


By = Annotated[str | None, typer.Option(help="Who decides (default: your user name).")]
Note = Annotated[str | None, typer.Option(help="Why, for the order's record.")]
Event = Annotated[str, typer.Option(help="The event the order's waiting step waits for.")]
Waiting = Annotated[str, typer.Argument(help="An order whose step waits for the event.")]


def _send_event(order_id: str, approved: bool, by, note, event, settings) -> None:
    from ordersctl.events import InvalidEvent, event_message, send_event

    try:  # validated before any connection
        message = event_message(order_id, approved=approved, by=by, note=note, event=event)
    except InvalidEvent as error:
        raise fail(str(error)) from error
    ctx = _context(settings)
    send_event(ctx.servicebus(), ctx.settings.order_events_queue, message)
    out.print(f"sent the {'approval' if approved else 'rejection'} of order [bold]{order_id}[/bold] ({event}) to "
              f"{ctx.settings.order_events_queue}; `ordersctl status {order_id}` shows the outcome")


@app.command()
def approve(order_id: Waiting, by: By = None, note: Note = None, event: Event = "approval",
            settings: SettingsFile = None) -> None:
    """Approve an order's waiting step (a message on order-events): the workflow goes on."""
    _send_event(order_id, True, by, note, event, settings)


@app.command()
def reject(order_id: Waiting, by: By = None, note: Note = None, event: Event = "approval",
           settings: SettingsFile = None) -> None:
    """Reject an order's waiting step (a message on order-events): the steps before it are undone."""
    _send_event(order_id, False, by, note, event, settings)


@app.command()
def cancel(
    order_id: Annotated[str, typer.Argument(help="An order that has not ended.")],
    reason: Annotated[str | None, typer.Option("--reason", help="Why (kept on the order, in its cause).")] = None,
    settings: SettingsFile = None,
) -> None:
    """Cancel an order: the step in flight settles, then every step applied (or whose
    outcome is unknown) is undone, newest first; the order ends Compensated. A no-op for
    an order cancelled before or Compensated; refused (exit 1) once Processed or in Error."""
    from adapters.store import OrderNotFound
    from core.lifecycle import CancelVerdict
    from core.models import CancelRequest
    from scheduler.cancellation import NotCancellable
    from scheduler.cancellation import cancel as do_cancel

    try:
        request = CancelRequest(order_id=order_id, reason=reason)
    except ValidationError as error:
        raise fail(f"invalid cancel: {explain(error)}") from error
    ctx = _context(settings)
    s = ctx.services
    try:
        done = do_cancel(request.order_id, reason=request.reason, by=f"ordersctl ({os.environ.get('USER') or 'operator'})",
                         store=s.store, publisher=s.publisher, nudger=s.nudger, now=utcnow())
    except (OrderNotFound, NotCancellable) as error:
        raise fail(str(error)) from error
    if done.verdict is CancelVerdict.ALREADY:
        out.print(f"order [bold]{order_id}[/bold]: nothing to do, {done.reason}")
        return
    out.print(f"order [bold]{order_id}[/bold] cancel recorded ({done.state.process_state.value}, step "
              f"{done.state.step}): the step in flight settles, then the order is undone")


archive_app = typer.Typer(no_args_is_help=True, help="Finished orders archived by retention (blob storage).")
app.add_typer(archive_app, name="archive")


@archive_app.command("show")
def archive_show(
    day: Annotated[str, typer.Argument(help="The UTC day the orders ended, YYYY-MM-DD.")],
    order: Annotated[str | None, typer.Option("--order", help="Print this order's archived document only.")] = None,
    full: Annotated[bool, typer.Option("--full", help="Every order's whole document, not a summary.")] = False,
    settings: SettingsFile = None,
) -> None:
    """A day's archived orders as JSON ({"day", "orders", "count"}), or with --order ID that
    order's document as the status API showed it; exit 1 when not archived."""
    from ordersctl.archive import NotArchived, checked, show

    try:
        checked(day, order)  # before any connection
        print(show(_context(settings).services.archive(), day, order=order, full=full))
    except (ValueError, NotArchived) as error:
        raise fail(str(error)) from error


#: The data role an identity needs for a storage service, by the SDK that was refused
#: (docs/deploy.md, "What gets created").
STORAGE_ROLES = {
    "azure.data.tables": "a Storage Table data role (Storage Table Data Contributor)",
    "azure.storage.blob": "a Storage Blob data role (Storage Blob Data Contributor on the archive container)",
    "azure.storage.queue": "a Storage Queue data role (Storage Queue Data Contributor)",
}


def http_refusal(error) -> str:
    """An Azure service's HTTP error (azure-core's HttpResponseError) as one line: the
    status, the error code, the service's message and, for a 403 from storage, the data
    role the signed-in identity needs."""
    status = getattr(error, "status_code", None)
    reason = getattr(error, "reason", None)
    body_code, body_said = _error_body(getattr(error, "response", None))
    headers = getattr(getattr(error, "response", None), "headers", None) or {}
    code = getattr(error, "error_code", None) or headers.get("x-ms-error-code") or body_code
    said = next((line.strip() for line in str(getattr(error, "message", None) or error).splitlines()
                 if line.strip()), "")
    if said.startswith("Operation returned an invalid status"):
        said = body_said  # the SDK's own words say no more than the status: the service's, if any
    modules = {frame.f_globals.get("__name__", "") for frame, _ in traceback.walk_tb(error.__traceback__)}
    sdk = next((sdk for sdk in STORAGE_ROLES if any(module.startswith(sdk) for module in modules)), None)
    text = (f"{'storage' if sdk else 'the service'} answered HTTP {status or '?'}" + (f" {reason}" if reason else "")
            + (f" ({code})" if code else ""))
    if said:
        text += f": {said[:300].rstrip('.')}"
    if status == 403 and sdk:
        text += (f". The signed-in identity needs {STORAGE_ROLES[sdk]} on the account (docs/deploy.md, "
                 "\"What gets created\"; a new role assignment takes a few minutes to apply)")
    return text


def _error_body(response) -> tuple[str | None, str]:
    """The error code and the first line of the message of an Azure error body: JSON
    (``{"odata.error": {"code", "message": {"value"}}}`` of Tables, ``{"error": ...}``) or
    XML (``<Error><Code/><Message/></Error>`` of Blobs and Queues); (None, "") otherwise."""
    try:
        text = response.text()
    except Exception:  # noqa: BLE001 - no body, or not text: nothing more to say
        return None, ""
    code, message = None, ""
    try:
        document = json.loads(text)
        inner = (document.get("odata.error") or document.get("error")) if isinstance(document, dict) else None
        if isinstance(inner, dict):
            code, message = inner.get("code"), inner.get("message")
            message = message.get("value") if isinstance(message, dict) else message
    except ValueError:
        found = {tag: re.search(rf"<{tag}>(.*?)</{tag}>", text or "", re.S) for tag in ("Code", "Message")}
        code = found["Code"].group(1) if found["Code"] else None
        message = found["Message"].group(1) if found["Message"] else ""
    first = next((line.strip() for line in str(message or "").splitlines() if line.strip()), "")
    return (str(code) if code else None), first


def main() -> None:
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ServiceRequestError
    from azure.servicebus.exceptions import ServiceBusConnectionError, ServiceBusError

    try:
        app(prog_name="ordersctl", standalone_mode=True)
    except (ServiceRequestError, ServiceBusConnectionError) as error:
        say_error(f"cannot reach the service: {error}")
        err.print("Is the local stack running (`make run`), or are the Azure settings right?", markup=False)
        raise SystemExit(1) from None
    except (ClientAuthenticationError, ServiceBusError) as error:
        say_error(f"{type(error).__name__}: {error}")
        raise SystemExit(1) from None
    except HttpResponseError as error:  # after ClientAuthenticationError, one of its kind
        say_error(http_refusal(error))
        raise SystemExit(1) from None
