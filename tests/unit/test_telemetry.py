"""The trace context carried in a nudge and in Service Bus application properties, and the
local JSON lines exporters, with the real OpenTelemetry SDK (no process-wide provider is
installed here: the spans come from a provider of the test's own, or from a child process
that configures telemetry as a host does)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import textwrap

import pytest
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from adapters import telemetry
from adapters.messaging import _message
from core import names
from core.models import Nudge, StatusEvent, Status, utcnow
from tests import ROOT


@pytest.fixture
def tracer():
    """A tracer of a provider of the test's own (the process-wide one stays the no-op)."""
    provider = TracerProvider()
    yield provider.get_tracer("test")
    provider.shutdown()


def w3c(span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


# --- nudges --------------------------------------------------------------------------------------


def test_a_nudge_carries_the_senders_span_and_the_claim_continues_it(tracer):
    with tracer.start_as_current_span("supervisor.retry") as sender:
        body = telemetry.stamp(Nudge(order_id="o-1")).model_dump_json(exclude_none=True)
    assert json.loads(body) == {"order_id": "o-1", "traceparent": w3c(sender)}

    received = Nudge.model_validate_json(body)
    parent = telemetry.parent_from_traceparent(received.traceparent, received.tracestate)
    with tracer.start_as_current_span("order.schedule", context=parent) as claim:
        pass
    assert claim.parent.span_id == sender.get_span_context().span_id
    assert claim.get_span_context().trace_id == sender.get_span_context().trace_id


def test_a_nudge_keeps_tracestate_and_is_unchanged_outside_a_trace(tracer):
    assert telemetry.stamp(Nudge(order_id="o-2")) == Nudge(order_id="o-2")  # no current span: nothing to carry
    parent = telemetry.parent_from_traceparent(f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01", "vendor=abc")
    with tracer.start_as_current_span("order.record", context=parent):
        nudge = telemetry.stamp(Nudge(order_id="o-2"))
    assert nudge.tracestate == "vendor=abc"
    assert telemetry.parent_from_traceparent(None) is None
    assert telemetry.parent_from_traceparent("not-a-traceparent") is None


# --- Service Bus application properties ---------------------------------------------------------


def test_a_service_bus_message_carries_the_senders_span_as_traceparent_and_diagnostic_id(tracer):
    event = StatusEvent(order_id="o-3", status=Status.RECEIVED, time=utcnow())
    with tracer.start_as_current_span("order.submit") as sender:
        message = _message(event, message_id="m", correlation_id="o-3", subject="received")
    properties = message.application_properties
    assert properties == {b"traceparent": w3c(sender), b"Diagnostic-Id": w3c(sender)}

    # On the wire: one traceparent, as an AMQP string key, also once the Azure SDK's own
    # tracing has had its say (it adds its keys only where none are set).
    outgoing = PyamqpTransport.to_outgoing_amqp_message(message)
    outgoing = PyamqpTransport.update_message_app_properties(outgoing, b"traceparent", "00-other-01")
    assert outgoing.application_properties[b"traceparent"] == w3c(sender)

    # The receiver (the Functions host hands string keys; the SDK bytes): the same parent.
    for received in (properties, {key.decode(): value for key, value in properties.items()}):
        parent = telemetry.parent_from_properties(received)
        assert trace.get_current_span(parent).get_span_context().span_id == sender.get_span_context().span_id


def test_no_context_outside_a_span():
    event = StatusEvent(order_id="o-4", status=Status.RECEIVED, time=utcnow())
    assert _message(event, message_id="m", correlation_id="o-4", subject="received").application_properties is None
    assert telemetry.message_properties() == {} and telemetry.traceparent() is None


def test_a_clients_traceparent_wins_and_a_w3c_diagnostic_id_is_honoured():
    ids = [(secrets.token_hex(16), secrets.token_hex(8)) for _ in range(2)]
    traceparent, diagnostic = (f"00-{trace_id}-{span_id}-01" for trace_id, span_id in ids)

    def parent_of(properties):
        context = telemetry.parent_from_properties(properties)
        span = trace.get_current_span(context).get_span_context() if context is not None else None
        return None if span is None else (f"{span.trace_id:032x}", f"{span.span_id:016x}")

    assert parent_of({"traceparent": traceparent, "Diagnostic-Id": diagnostic}) == ids[0]
    assert parent_of({"Diagnostic-Id": diagnostic}) == ids[1]
    assert parent_of({b"diagnostic-id": diagnostic.encode()}) == ids[1]
    # An old hierarchical Request-Id, garbage, or nothing: no parent (a new trace).
    assert parent_of({"Diagnostic-Id": "|4bf92f3577b34da6.1."}) is None
    assert parent_of({"traceparent": "00-0000-0000-01"}) is None
    assert parent_of({}) is None and parent_of(None) is None


def test_the_propagator_writes_the_w3c_header_the_remote_services_receive(tracer):
    with tracer.start_as_current_span("POST /reserve") as call:
        headers = telemetry.current()
    assert headers == {"traceparent": w3c(call)}
    assert TraceContextTextMapPropagator().extract(headers)  # a W3C reader reads it back


# --- the local exporters ------------------------------------------------------------------------------


HOST = textwrap.dedent(
    """
    import sys
    from adapters import telemetry
    from adapters.settings import Settings
    from core import names

    settings = Settings(AzureWebJobsStorage="UseDevelopmentStorage=true", ServiceBusConnection="x",
                        OTEL_SPANS_FILE=sys.argv[1], OTEL_METRICS_FILE=sys.argv[2])
    assert telemetry.configure(settings, "instance-1") is telemetry.Mode.FILES
    parent = telemetry.parent_from_properties({"traceparent": sys.argv[3]})
    with telemetry.entry(names.SPAN_SUBMIT, parent, order_id="o-5"):
        telemetry.annotate(outcome="created")
        with telemetry.span(names.SPAN_CLAIM, step="reserve", kind="action", attempt=1):
            telemetry.line_claimed("reserve", "action", retry=False)
        with telemetry.entry(names.SPAN_SCHEDULE, None, order_id="o-5"):
            pass  # an entry point whose message carries nothing starts a new trace
    try:
        with telemetry.span(names.SPAN_CLOSE, order_id="o-5", state="Error"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    telemetry.order_closed("Processed")
    telemetry.line_answered("reserve", "action", "succeeded", 0.3)
    """
)


def test_a_host_writes_its_spans_and_metric_points_as_json_lines(tmp_path):
    spans_file, metrics_file = tmp_path / "spans.jsonl", tmp_path / "metrics.jsonl"
    client = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    # A process of its own, as a host: configure() installs the process-wide providers.
    run = subprocess.run(
        [sys.executable, "-c", HOST, str(spans_file), str(metrics_file), client],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert run.returncode == 0, run.stderr

    spans = {span["name"]: span for span in telemetry.read_json_lines([spans_file])}
    assert set(spans) == {names.SPAN_SUBMIT, names.SPAN_CLAIM, names.SPAN_SCHEDULE, names.SPAN_CLOSE}
    submit, claim = spans[names.SPAN_SUBMIT], spans[names.SPAN_CLAIM]
    assert (submit["trace_id"], submit["parent_span_id"]) == tuple(client.split("-")[1:3])
    assert (claim["trace_id"], claim["parent_span_id"]) == (submit["trace_id"], submit["span_id"])
    assert submit["kind"] == "CONSUMER" and claim["kind"] == "INTERNAL"
    assert submit["attributes"] == {
        names.ATTR_ORDER_ID: "o-5", names.ATTR_OUTCOME: "created", names.ATTR_INSTANCE: "instance-1"
    }
    assert claim["attributes"][names.ATTR_STEP] == "reserve" and claim["attributes"][names.ATTR_ATTEMPT] == 1
    assert (submit["service"], submit["instance"]) == (names.TELEMETRY_SERVICE, "instance-1")
    assert submit["start"] <= claim["start"] <= claim["end"] <= submit["end"] and submit["duration_ms"] >= 0
    schedule = spans[names.SPAN_SCHEDULE]
    assert schedule["parent_span_id"] is None and schedule["trace_id"] != submit["trace_id"]
    close = spans[names.SPAN_CLOSE]
    assert close["status"] == "ERROR" and close["events"][0]["name"] == "exception"

    points = {point["name"]: point for point in telemetry.read_json_lines([metrics_file])}
    assert points[names.METRIC_ORDERS_CLOSED]["value"] == 1
    assert points[names.METRIC_ORDERS_CLOSED]["attributes"] == {names.ATTR_STATE: "Processed"}
    assert points[names.METRIC_STEPS_CLAIMED]["attributes"] == {names.ATTR_STEP: "reserve", names.ATTR_KIND: "action"}
    duration = points[names.METRIC_STEP_DURATION]["value"]
    assert (duration["count"], duration["sum"]) == (1, 0.3) and duration["bounds"] == list(telemetry.DURATION_BUCKETS)
    assert points[names.METRIC_STEP_DURATION]["unit"] == "s"


def test_metric_points_are_written_when_they_change_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    reader = PeriodicExportingMetricReader(telemetry.JsonLinesMetricExporter(path), export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    try:
        counter = provider.get_meter("test").create_counter(names.METRIC_ORDERS_CLOSED)
        counter.add(1, {names.ATTR_STATE: "Processed"})
        reader.collect()
        reader.collect()  # nothing changed: nothing written
        counter.add(2, {names.ATTR_STATE: "Processed"})
        reader.collect()
    finally:
        provider.shutdown()
    assert [point["value"] for point in telemetry.read_json_lines([path])] == [1, 3]  # cumulative


def test_a_line_being_written_is_left_for_the_next_read(tmp_path):
    path = tmp_path / "spans.jsonl"
    path.write_text('{"name": "a"}\n{"name": "b"}\n{"name": "c", "att')
    assert telemetry.read_json_lines([path, tmp_path / "missing.jsonl"]) == [{"name": "a"}, {"name": "b"}]


def test_every_metric_has_an_instrument():
    instruments = {instrument._name for instrument in vars(telemetry.METRICS).values()}
    assert instruments == set(names.METRICS)


class _AzureSettings:
    """What ``_configure_azure`` reads of the settings: the connection string and the identity."""

    applicationinsights_connection_string = "InstrumentationKey=00000000-0000-0000-0000-000000000000"

    def telemetry_identity(self):
        return False, None


@pytest.mark.parametrize("listed", ["", "requests", "requests, azure_sdk", "azure_sdk"])
def test_azure_sdk_spans_follow_otel_python_disabled_instrumentations(monkeypatch, listed):
    """In Azure the Azure SDK's calls are dependency spans unless the documented variable lists
    azure_sdk: azure-monitor-opentelemetry lets an explicit instrumentation option win over
    the variable (its _utils/configurations.py), so the app reads the variable itself."""
    import azure.monitor.opentelemetry as monitor

    from adapters import telemetry

    passed = {}
    monkeypatch.setattr(monitor, "configure_azure_monitor", lambda **options: passed.update(options))
    monkeypatch.setenv("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", listed)
    telemetry._configure_azure(_AzureSettings(), "instance-1")
    options = passed["instrumentation_options"]
    assert options["azure_sdk"] == {"enabled": "azure_sdk" not in listed}
    assert all(options[name] == {"enabled": False} for name in ("requests", "urllib", "urllib3"))


def test_one_process_is_one_instance_when_azure_names_none(monkeypatch):
    """Claims (LockedBy) and telemetry (faas.instance) each ask for the instance's name: the
    same name, drawn once per process, when WEBSITE_INSTANCE_ID is not set; Azure's when it is."""
    from adapters.wiring import instance_id

    monkeypatch.delenv("WEBSITE_INSTANCE_ID", raising=False)
    assert instance_id() == instance_id()
    monkeypatch.setenv("WEBSITE_INSTANCE_ID", "azure-instance-7")
    assert instance_id() == "azure-instance-7"
