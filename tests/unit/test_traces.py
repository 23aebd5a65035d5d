"""An order's spans from Application Insights (adapters/traces.py): rows of the
workspace-based tables ``AppRequests`` and ``AppDependencies``, shaped as the Azure Monitor
table reference describes their columns, become the span dicts of the local spans files;
and the trace endpoint falls back to the step rows when the query fails. No network."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from azure.monitor.query import LogsQueryStatus

from adapters import traces
from api import ops
from core import names
from core.models import OrderState, ProcessState

TRACE = "4aa4d80ee0a65f544fcabd863db4c1b6"
T0 = datetime(2026, 11, 23, 13, 37, 44, 723763, tzinfo=UTC)
COLUMNS = [
    "SourceTable", "TimeGenerated", "Name", "OperationId", "Id", "ParentId", "DurationMs", "Success",
    "DependencyType", "Properties", "AppRoleName", "AppRoleInstance",
]


def row(table, start, name, span_id, parent, duration, success, dependency_type=None, **properties):
    # Properties (the span's attributes as custom dimensions): strings, as the exporter sends them;
    # the query API returns a dynamic column as its JSON text.
    return [table, start, name, TRACE, span_id, parent, duration, success, dependency_type,
            json.dumps(properties), names.TELEMETRY_SERVICE, "563d-host"]


ROWS = [
    row("AppRequests", T0, "order.submit", "53d845b5d0b78f3f", TRACE, 12.5, True, **{names.ATTR_ORDER_ID: "o-1"}),
    row("AppDependencies", T0 + timedelta(milliseconds=20), "order.claim", "b71a9443afc4037e", "53d845b5d0b78f3f",
        36.542, True, "InProc", **{names.ATTR_ORDER_ID: "o-1", names.ATTR_STEP: "reserve", names.ATTR_KIND: "action",
                                   names.ATTR_ATTEMPT: "1"}),
    row("AppDependencies", T0 + timedelta(milliseconds=80), "POST /reserve", "c000000000000001", "a000000000000001",
        250.0, False, "HTTP", **{names.ATTR_ORDER_ID: "o-1", names.ATTR_STEP: "reserve",
                                  "http.response.status_code": "503"}),
]


def test_a_request_row_is_a_consumer_span_as_the_files_hold_it():
    span = traces.span_from_row(dict(zip(COLUMNS, ROWS[0], strict=True)))
    assert span == {
        "name": "order.submit", "kind": "CONSUMER", "trace_id": TRACE, "span_id": "53d845b5d0b78f3f",
        "parent_span_id": None,  # a root's ParentId is its operation (trace) id
        "start": "2026-11-23T13:37:44.723763Z", "end": "2026-11-23T13:37:44.736263Z", "duration_ms": 12.5,
        "status": "UNSET", "attributes": {names.ATTR_ORDER_ID: "o-1"},
        "service": names.TELEMETRY_SERVICE, "instance": "563d-host",
    }


def test_dependency_rows_keep_their_parent_kind_status_and_numbers():
    claim, call = (traces.span_from_row(dict(zip(COLUMNS, r, strict=True))) for r in ROWS[1:])
    assert (claim["kind"], claim["parent_span_id"], claim["status"]) == ("INTERNAL", "53d845b5d0b78f3f", "UNSET")
    assert claim["attributes"][names.ATTR_ATTEMPT] == 1  # a number again, as recorded
    assert (call["kind"], call["status"], call["attributes"]["http.response.status_code"]) == ("CLIENT", "ERROR", 503)
    assert call["start"] == "2026-11-23T13:37:44.803763Z" and call["end"] == "2026-11-23T13:37:45.053763Z"


def test_rows_with_text_times_and_dict_properties_map_alike():
    values = dict(zip(COLUMNS, ROWS[1], strict=True))
    values.update(TimeGenerated="2026-11-23T13:37:44.743763Z", Properties={names.ATTR_ATTEMPT: "2"}, Success="False")
    span = traces.span_from_row(values)
    assert (span["start"], span["attributes"], span["status"]) == ("2026-11-23T13:37:44.743763Z",
                                                                  {names.ATTR_ATTEMPT: 2}, "ERROR")


def test_the_query_names_the_trace_and_the_order_and_quotes_them():
    query = traces.appinsights_query('o-1"x', TRACE)
    assert f'OperationId == "{TRACE}"' in query and 'Properties["order.id"]) == "o-1\\"x"' in query
    assert "union withsource=SourceTable AppRequests, AppDependencies" in query
    assert query.endswith(f"| take {traces.MAX_SPANS + 1}")
    assert "OperationId ==" not in traces.appinsights_query("o-1", None)
    assert traces.trace_id_of(f"00-{TRACE}-b71a9443afc4037e-01") == TRACE
    assert traces.trace_id_of(None) is None and traces.trace_id_of("garbage") is None


def state(process_state=ProcessState.PROCESSED) -> OrderState:
    return OrderState(
        order_id="o-1", process_state=process_state, complete_by=T0 + timedelta(hours=1),
        created_at=T0, updated_at=T0 + timedelta(seconds=5), trace_parent=f"00-{TRACE}-53d845b5d0b78f3f-01",
    )


class FakeStore:
    def get(self, order_id):
        return state()


class FakeClient:
    def __init__(self, error=None):
        self.error, self.calls = error, []

    def query_workspace(self, workspace_id, query, *, timespan, server_timeout):
        self.calls.append((workspace_id, query, timespan))
        if self.error:
            raise self.error
        table = SimpleNamespace(columns=COLUMNS, rows=list(reversed(ROWS)))
        return SimpleNamespace(status=LogsQueryStatus.SUCCESS, tables=[table])


SOURCE = traces.SpanSource("appinsights", workspace_id="ws-guid", client_id="client-id")


def test_the_trace_endpoint_reads_the_workspace_over_the_orders_lifetime(monkeypatch):
    client = FakeClient()
    monkeypatch.setattr(traces, "_logs_client", lambda client_id: client)
    reply = ops.trace("o-1", store=FakeStore(), spans=SOURCE, now=T0 + timedelta(days=1))
    assert reply.status == 200
    body = reply.body
    assert (body["source"], body["note"], body["trace_ids"], body["truncated"]) == ("appinsights", None, [TRACE], False)
    assert [s["name"] for s in body["spans"]] == ["order.submit", "order.claim", "POST /reserve"]
    ((workspace, _, timespan),) = client.calls
    # A closed order: from its creation to its last write, with the margin either side.
    assert (workspace, timespan) == ("ws-guid", (T0 - traces.QUERY_MARGIN,
                                                 T0 + timedelta(seconds=5) + traces.QUERY_MARGIN))


def test_a_failed_query_falls_back_to_the_step_rows_and_says_why(monkeypatch):
    monkeypatch.setattr(traces, "_logs_client", lambda client_id: FakeClient(PermissionError("403 Forbidden")))
    body = ops.trace("o-1", store=FakeStore(), spans=SOURCE, now=T0).body
    assert (body["source"], body["spans"], body["trace_ids"]) == ("none", [], [])
    assert "Application Insights could not be queried" in body["note"] and "403 Forbidden" in body["note"]
    assert "step rows" in body["note"]


def test_the_workspace_setting_chooses_application_insights_unless_files_are_set():
    settings = SimpleNamespace(
        trace_spans_files=None, spans_file=None, applicationinsights_workspace_id="ws-guid",
        applicationinsights_connection_string="InstrumentationKey=x",
        telemetry_identity=lambda: (True, "client-id"),
    )
    assert traces.source(settings) == SOURCE
    settings.applicationinsights_workspace_id = None
    fallback = traces.source(settings)
    assert fallback.kind == "none" and names.APPINSIGHTS_WORKSPACE_SETTING in fallback.note
    settings.trace_spans_files = "/tmp/spans-*.jsonl"
    assert traces.source(settings).kind == "files"
