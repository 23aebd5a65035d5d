"""Traces and metrics with OpenTelemetry: one trace per order, from the client's message
to the order's final state, and the app's metrics (their names are in core.names;
docs/observability.md explains each one).

Where they go, chosen once per process on first use (:func:`configure`):

- ``APPLICATIONINSIGHTS_CONNECTION_STRING`` set (Azure): Application Insights through
  ``azure-monitor-opentelemetry``, with the Entra ID token of the identity that
  ``APPLICATIONINSIGHTS_AUTHENTICATION_STRING`` names (the component takes no key).
- else ``OTEL_SPANS_FILE`` / ``OTEL_METRICS_FILE`` (the local stack): JSON lines appended
  to those files, one span or one changed metric point per line.
- neither: off. The API's no-op tracer and meter cost next to nothing, and a trace
  context that arrives is still handed on, so a client's trace is never cut.

How an order's trace context travels from hop to hop:

- Service Bus: the application properties ``traceparent`` and ``tracestate`` (W3C), plus
  ``Diagnostic-Id`` (the same value, which Azure's own consumers read). A client that
  sends only ``Diagnostic-Id`` (older Azure SDKs) has it honoured as the parent.
- storage-queue nudges: the Nudge's ``traceparent`` and ``tracestate`` fields.
- the state row: ``TraceParent``, the submission's context, written once, so the
  supervisor's resets and an operator's resubmit continue the order's trace.
- the remote services: the ``traceparent`` header of each call's HTTP client span.

Every entry point (a function trigger) starts a span whose parent is what its message
carries (a new root when it carries nothing); everything it sends carries that span's
context, which the sending edge (adapters.messaging) stamps from the current span.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from core import names
from core.models import Nudge

log = logging.getLogger(__name__)

#: The Azure SDKs log every HTTP request and AMQP link event at INFO. In Azure the Python runtime sends
#: each record of the app's process to the Functions host, and Application Insights would keep one trace
#: per storage request; locally they would flood the host log. Their warnings and errors still go.
SDK_LOGGERS = ("azure.core", "azure.servicebus", "azure.storage", "azure.data.tables", "azure.identity",
               "azure.monitor")
for _name in SDK_LOGGERS:
    logging.getLogger(_name).setLevel(logging.WARNING)

_PROPAGATOR = TraceContextTextMapPropagator()
_SCOPE = names.TELEMETRY_SERVICE
#: Spans reach the local file this long after they end, at most (OTEL_BSP_SCHEDULE_DELAY overrides).
LOCAL_SPAN_DELAY_MS = 1000
#: Metric points are written this often (OTEL_METRIC_EXPORT_INTERVAL overrides).
LOCAL_METRIC_INTERVAL_MS = 5000
#: Step durations, in seconds.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

#: A trace context (a span's parent), as the OpenTelemetry API passes it.
TraceContext = otel_context.Context

# Proxies until configure() installs real providers (the API hands these out at import).
tracer = trace.get_tracer(_SCOPE)
_meter = metrics.get_meter(_SCOPE)


class Mode(str, Enum):
    AZURE = "azure"
    FILES = "files"
    OFF = "off"


_lock = threading.Lock()
_mode: Mode | None = None
_instance: str | None = None


def configure(settings, instance: str) -> Mode:
    """Install the exporters the settings ask for (once per process; later calls return
    what the first chose). ``instance`` is this host instance (``service.instance.id``)."""
    global _mode, _instance
    with _lock:
        if _mode is not None:
            return _mode
        _instance = instance
        # No exemplars (sample spans attached to metric points): neither exporter here
        # uses them, and offering each measurement to a reservoir costs on every add.
        os.environ.setdefault("OTEL_METRICS_EXEMPLAR_FILTER", "always_off")
        _mode = Mode.OFF
        try:
            if settings.applicationinsights_connection_string:
                _configure_azure(settings, instance)
                _mode = Mode.AZURE
            elif settings.spans_file or settings.metrics_file:
                _configure_files(settings, instance)
                _mode = Mode.FILES
        except Exception:  # noqa: BLE001 - by design: telemetry never keeps an order from running
            log.exception("telemetry could not be set up; the app runs without it")
        log.info("telemetry: %s", _mode.value)
        return _mode


def _resource(instance: str):
    from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource

    return Resource.create({SERVICE_NAME: names.TELEMETRY_SERVICE, SERVICE_INSTANCE_ID: instance})


def disabled_instrumentations() -> set[str]:
    """The instrumentations ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` turns off (comma-separated)."""
    listed = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    return {name.strip() for name in listed.split(",") if name.strip()}


def _configure_azure(settings, instance: str) -> None:
    from azure.monitor.opentelemetry import configure_azure_monitor

    from adapters.clients import credential

    aad, client_id = settings.telemetry_identity()
    configure_azure_monitor(
        connection_string=settings.applicationinsights_connection_string,
        # The component accepts Entra ID tokens only (local auth disabled in the Bicep).
        credential=credential(client_id) if aad else None,
        resource=_resource(instance),
        # The Functions host already sends the worker's logs to Application Insights.
        disable_logging=True,
        # Azure SDK calls (tables, queues, Service Bus) become dependency spans of the
        # order's spans, unless OTEL_PYTHON_DISABLED_INSTRUMENTATIONS lists azure_sdk (an
        # explicit option here would win over it); their HTTP transport is not traced twice.
        instrumentation_options={
            "azure_sdk": {"enabled": "azure_sdk" not in disabled_instrumentations()},
            **{library: {"enabled": False} for library in ("requests", "urllib", "urllib3")},
        },
    )


def _configure_files(settings, instance: str) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = _resource(instance)
    if settings.spans_file:
        provider = TracerProvider(resource=resource)
        delay = None if "OTEL_BSP_SCHEDULE_DELAY" in os.environ else LOCAL_SPAN_DELAY_MS
        exporter = JsonLinesSpanExporter(settings.spans_file)
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=delay))
        trace.set_tracer_provider(provider)
    if settings.metrics_file:
        interval = None if "OTEL_METRIC_EXPORT_INTERVAL" in os.environ else LOCAL_METRIC_INTERVAL_MS
        points = JsonLinesMetricExporter(settings.metrics_file)
        reader = PeriodicExportingMetricReader(points, export_interval_millis=interval)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader], resource=resource))


# --- context: extract, inject ------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def parent_from_properties(properties: Mapping[Any, Any] | None) -> otel_context.Context | None:
    """The sender's trace context in a message's application properties: ``traceparent``
    (with ``tracestate``), else a W3C ``Diagnostic-Id``; None when there is none (or it
    is not valid W3C, e.g. an old hierarchical Request-Id)."""
    if not properties:
        return None
    carrier = {_text(key).lower(): _text(value) for key, value in properties.items() if value is not None}
    if "traceparent" not in carrier and "diagnostic-id" in carrier:
        carrier["traceparent"] = carrier["diagnostic-id"]
    return _valid(_PROPAGATOR.extract(carrier))


def parent_from_traceparent(traceparent: str | None, tracestate: str | None = None) -> otel_context.Context | None:
    """A stored or nudged ``traceparent`` (and ``tracestate``) as a parent context, or None."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent, **({"tracestate": tracestate} if tracestate else {})}
    return _valid(_PROPAGATOR.extract(carrier))


def _valid(ctx: otel_context.Context) -> otel_context.Context | None:
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def current() -> dict[str, str]:
    """The current span's context as W3C headers: ``{"traceparent": ..., "tracestate": ...}``
    (empty when there is no valid context)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier


def traceparent() -> str | None:
    """The current span's ``traceparent``, or None."""
    return current().get("traceparent")


def message_properties() -> dict[bytes, str]:
    """Service Bus application properties that carry the current span's context.

    Keys are bytes, as the Azure SDK's own tracing writes them: when its tracing is on
    (Application Insights), it then keeps ours instead of adding a second copy."""
    carrier = current()
    if "traceparent" not in carrier:
        return {}
    properties = {b"traceparent": carrier["traceparent"], b"Diagnostic-Id": carrier["traceparent"]}
    if carrier.get("tracestate"):
        properties[b"tracestate"] = carrier["tracestate"]
    return properties


def stamp(nudge: Nudge) -> Nudge:
    """The nudge with the current span's context (unchanged when there is none)."""
    carrier = current()
    if "traceparent" not in carrier:
        return nudge
    return nudge.model_copy(update={"traceparent": carrier["traceparent"], "tracestate": carrier.get("tracestate")})


# --- spans ------------------------------------------------------------------------------------


def attributes(
    *, order_id: str | None = None, step: str | None = None, kind: Any = None, attempt: int | None = None, **more: Any
) -> dict[str, Any]:
    """Span attributes under their names in core.names, None values left out."""
    values = {
        names.ATTR_ORDER_ID: order_id,
        names.ATTR_STEP: step,
        names.ATTR_KIND: kind,
        names.ATTR_ATTEMPT: attempt,
        **{getattr(names, f"ATTR_{key.upper()}"): value for key, value in more.items()},
    }
    return {
        key: value.value if isinstance(value, Enum) else value for key, value in values.items() if value is not None
    }


@contextmanager
def entry(
    name: str, parent: otel_context.Context | None, *, span_kind: SpanKind = SpanKind.CONSUMER, **attrs: Any
) -> Iterator[trace.Span]:
    """The span of a function invocation: a child of what its message carried, else the
    root of a new trace (never of whatever happened to be current on this thread)."""
    with tracer.start_as_current_span(
        name, context=parent if parent is not None else otel_context.Context(), kind=span_kind,
        attributes=_with_instance(attrs),
    ) as span:
        yield span


def continue_order(name: str, trace_parent: str | None, **attrs: Any):
    """A span in an order's own trace, from the ``TraceParent`` its state row keeps (the
    supervisor acting on it, an operator resubmitting it); a new trace for an order
    that has none."""
    return entry(name, parent_from_traceparent(trace_parent), span_kind=SpanKind.INTERNAL, **attrs)


@contextmanager
def span(name: str, *, span_kind: SpanKind = SpanKind.INTERNAL, **attrs: Any) -> Iterator[trace.Span]:
    """A child of the current span."""
    with tracer.start_as_current_span(name, kind=span_kind, attributes=_with_instance(attrs)) as current_span:
        yield current_span


def client_span(name: str, **attrs: Any):
    """A child of the current span for a call to another service (an HTTP request)."""
    return span(name, span_kind=SpanKind.CLIENT, **attrs)


def _with_instance(attrs: dict[str, Any]) -> dict[str, Any]:
    values = attributes(**attrs)
    if _instance is not None:
        values.setdefault(names.ATTR_INSTANCE, _instance)
    return values


def annotate(name: str | None = None, **attrs: Any) -> None:
    """Add attributes to the current span (and rename it, e.g. once a claim is written)."""
    current_span = trace.get_current_span()
    if not current_span.is_recording():
        return
    if name is not None:
        current_span.update_name(name)
    current_span.set_attributes(attributes(**attrs))


def error(description: str) -> None:
    """Mark the current span failed (an outcome that is not an exception)."""
    current_span = trace.get_current_span()
    if current_span.is_recording():
        current_span.set_status(Status(StatusCode.ERROR, description[:500]))


# --- metrics ----------------------------------------------------------------------------------


class _Tally:
    """Counts by attributes, thread-safe, for an observable counter to read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[tuple[str, str], ...], int] = {}

    def add(self, *attributes: tuple[str, str]) -> None:
        with self._lock:
            self._counts[attributes] = self._counts.get(attributes, 0) + 1

    def read(self) -> list[tuple[dict[str, str], int]]:
        with self._lock:
            return [(dict(attributes), count) for attributes, count in self._counts.items()]


_TABLE_OPERATIONS = _Tally()
_MESSAGES_SENT = _Tally()


def _tally_reader(tally: _Tally):
    def observe(options):
        return [metrics.Observation(count, attributes) for attributes, count in tally.read()]

    return observe


class _Metrics:
    """The app's instruments (created once; proxies until a meter provider is installed)."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.orders_submitted = meter.create_counter(
            names.METRIC_ORDERS_SUBMITTED, unit="{order}", description="Order messages taken in, by result."
        )
        self.orders_closed = meter.create_counter(
            names.METRIC_ORDERS_CLOSED, unit="{order}", description="Orders that reached a final state, by state."
        )
        self.steps_claimed = meter.create_counter(
            names.METRIC_STEPS_CLAIMED, unit="{attempt}",
            description="Attempts of a line started (claims), by step and kind.",
        )
        self.step_duration = meter.create_histogram(
            names.METRIC_STEP_DURATION, unit="s", description="From a line's claim to its response recorded.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.deadline_misses = meter.create_counter(
            names.METRIC_DEADLINE_MISSES, unit="{attempt}",
            description="Attempts whose complete-by passed (the supervisor reset the line or gave up on it).",
        )
        self.step_retries = meter.create_counter(
            names.METRIC_STEP_RETRIES, unit="{attempt}", description="Lines claimed again after a failed attempt."
        )
        self.compensations = meter.create_counter(
            names.METRIC_COMPENSATIONS, unit="{compensation}",
            description="Compensations (undos) that ended, by outcome.",
        )
        self.remote_retries = meter.create_counter(
            names.METRIC_REMOTE_RETRIES, unit="{call}", description="Calls to a remote service after a request's first."
        )
        self.breaker_changes = meter.create_counter(
            names.METRIC_BREAKER_CHANGES, unit="{change}",
            description="Circuit breaker state changes, by the state entered.",
        )
        self.messages_dropped = meter.create_counter(
            names.METRIC_MESSAGES_DROPPED, unit="{message}",
            description="Internal messages that could not be acted on, dropped at once, by kind and reason.",
        )
        # Per operation, so counted the cheap way: a tally in the process (a dict increment),
        # read by the SDK when it collects (an SDK counter's add costs tens of microseconds).
        self.table_operations = meter.create_observable_counter(
            names.METRIC_TABLE_OPERATIONS, callbacks=[_tally_reader(_TABLE_OPERATIONS)], unit="{operation}",
            description="Table Storage operations, by kind.",
        )
        self.messages_sent = meter.create_observable_counter(
            names.METRIC_MESSAGES_SENT, callbacks=[_tally_reader(_MESSAGES_SENT)], unit="{message}",
            description="Service Bus and storage-queue messages sent, by kind.",
        )


METRICS = _Metrics(_meter)


def order_submitted(result: str) -> None:
    METRICS.orders_submitted.add(1, attributes(outcome=result))


def order_closed(state: Any) -> None:
    METRICS.orders_closed.add(1, attributes(state=state))


def line_claimed(step: str | None, kind: Any, *, retry: bool) -> None:
    where = attributes(step=step, kind=kind)
    METRICS.steps_claimed.add(1, where)
    if retry:
        METRICS.step_retries.add(1, where)


def line_answered(step: str | None, kind: Any, outcome: Any, seconds: float) -> None:
    METRICS.step_duration.record(max(0.0, seconds), attributes(step=step, kind=kind, outcome=outcome))


def deadline_missed(step: str | None, kind: Any, verdict: Any) -> None:
    METRICS.deadline_misses.add(1, attributes(step=step, kind=kind, verdict=verdict))


def compensation_ended(step: str, outcome: Any) -> None:
    METRICS.compensations.add(1, attributes(step=step, outcome=outcome))


def remote_retried(remote: str, action: str) -> None:
    METRICS.remote_retries.add(1, attributes(remote=remote, action=action))


def breaker_changed(remote: str, state: Any) -> None:
    METRICS.breaker_changes.add(1, attributes(remote=remote, breaker_state=state))


def table_operation(operation: str) -> None:
    _TABLE_OPERATIONS.add((names.ATTR_OPERATION, operation))


def message_dropped(operation: str, reason: str) -> None:
    """An internal message (``operation``: nudge, agent_request, agent_response) dropped
    because it cannot be acted on (``reason``: one of ``names.DROP_*``)."""
    METRICS.messages_dropped.add(1, attributes(operation=operation, drop_reason=reason))


def message_sent(transport: str, operation: str) -> None:
    _MESSAGES_SENT.add((names.ATTR_TRANSPORT, transport), (names.ATTR_OPERATION, operation))


# --- local exporters: JSON lines ----------------------------------------------------------------


def _iso(nanoseconds: int | None) -> str | None:
    if nanoseconds is None:
        return None
    return datetime.fromtimestamp(nanoseconds / 1e9, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


class _AppendFile:
    """A file that whole batches are appended to, one ``write`` each (O_APPEND): readers
    see whole lines, and processes that share a file do not cut into each other's lines."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def append(self, lines: list[str]) -> None:
        if not lines:
            return
        data = "".join(lines).encode("utf-8")
        with self._lock:
            if self._fd is None:
                return
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), default=str) + "\n"


def span_record(span) -> dict[str, Any]:
    """One finished span as the spans file holds it (docs/observability.md)."""
    context = span.context
    resource = span.resource.attributes if span.resource is not None else {}
    record: dict[str, Any] = {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": _hex(context.trace_id, 32),
        "span_id": _hex(context.span_id, 16),
        "parent_span_id": _hex(span.parent.span_id, 16) if span.parent is not None else None,
        "start": _iso(span.start_time),
        "end": _iso(span.end_time),
        "duration_ms": round(((span.end_time or 0) - (span.start_time or 0)) / 1e6, 3),
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "service": resource.get("service.name"),
        "instance": resource.get("service.instance.id"),
    }
    if span.status.description:
        record["status_message"] = span.status.description
    if span.events:
        record["events"] = [
            {"name": event.name, "time": _iso(event.timestamp), "attributes": dict(event.attributes or {})}
            for event in span.events
        ]
    if span.links:
        record["links"] = [
            {"trace_id": _hex(link.context.trace_id, 32), "span_id": _hex(link.context.span_id, 16)}
            for link in span.links
        ]
    return record


class JsonLinesSpanExporter(SpanExporter):
    """Finished spans as JSON lines appended to a file (the local stack's trace store)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._file = _AppendFile(path)

    def export(self, spans):
        try:
            self._file.append([_line(span_record(span)) for span in spans])
        except OSError as error:
            log.warning("spans not written to %s: %s", self._file.path, error)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class JsonLinesMetricExporter(MetricExporter):
    """Metric points as JSON lines appended to a file: cumulative since the process
    started, one line per point that changed since the last export (an idle host writes
    nothing)."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__()
        self._file = _AppendFile(path)
        self._last: dict[tuple, Any] = {}

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
        lines = []
        for resource_metrics in metrics_data.resource_metrics:
            instance = resource_metrics.resource.attributes.get("service.instance.id")
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    for point in metric.data.data_points:
                        value = _point_value(point)
                        key = (metric.name, tuple(sorted(point.attributes.items())) if point.attributes else ())
                        if self._last.get(key) == value:
                            continue
                        self._last[key] = value
                        lines.append(_line({
                            "time": _iso(point.time_unix_nano),
                            "name": metric.name,
                            "unit": metric.unit,
                            "attributes": dict(point.attributes or {}),
                            "value": value,
                            "instance": instance,
                        }))  # fmt: skip
        try:
            self._file.append(lines)
        except OSError as error:
            log.warning("metrics not written to %s: %s", self._file.path, error)
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self._file.close()


def _point_value(point) -> Any:
    if hasattr(point, "bucket_counts"):  # a histogram
        return {
            "count": point.count, "sum": point.sum, "min": point.min, "max": point.max,
            "bounds": list(point.explicit_bounds), "buckets": list(point.bucket_counts),
        }
    return point.value


def read_json_lines(paths) -> list[dict[str, Any]]:
    """Every record of these spans or metrics files, in file order (a missing file reads
    as empty; a last line still being written is left for the next read)."""
    records = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        complete = text[: text.rfind("\n") + 1]
        records += [json.loads(line) for line in complete.splitlines() if line.strip()]
    return records
