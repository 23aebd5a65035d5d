"""One order's spans, for the operator page's timeline (``GET /api/orders/{id}/trace``).

Where they are read from (:func:`source`):

- **the local stack**: the JSON lines files each host appends its spans to
  (adapters/telemetry.py, docs/observability.md): every host's, through the glob of the
  app setting ``TRACE_SPANS_FILES`` (the local stack sets it), else this host's own
  ``OTEL_SPANS_FILE``.
- **Azure**: Application Insights, through its Log Analytics workspace (app setting
  ``APPLICATIONINSIGHTS_WORKSPACE_ID``, set by the Bicep): one query of the
  workspace-based tables ``AppRequests`` and ``AppDependencies`` for the order's trace
  (the state row's ``TraceParent``) over the order's lifetime, with the app's managed
  identity (Log Analytics Reader on the workspace). Each row becomes the same span dict
  the files hold (:func:`span_from_row`), so the page draws them unchanged. A query that
  fails leaves the page with the order's step rows (api/ops.py says why in ``note``).

An order's spans are those that carry its ``order.id``, and every other span of the same
traces (an order is one trace; a resubmit continues it). A line is parsed only when it
names the order id or one of its trace ids, so a long-running local stack's files cost a
text scan, not a JSON parse per span.
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

from core import names

#: The most spans one reply carries (an order's trace has a few dozen; a pathological one
#: that was retried for hours could have thousands).
MAX_SPANS = 2000


@dataclass(frozen=True)
class SpanSource:
    """Where an order's spans are read from: ``files`` (a glob pattern, or one path),
    ``appinsights`` (a Log Analytics workspace id, queried as the identity ``client_id``
    names), or ``none`` with the reason."""

    kind: str
    pattern: str | None = None
    note: str | None = None
    workspace_id: str | None = None
    client_id: str | None = None

    def files(self) -> list[Path]:
        if not self.pattern:
            return []
        return sorted(Path(path) for path in glob.glob(self.pattern))


def source(settings) -> SpanSource:
    """The span source this app's settings name."""
    pattern = settings.trace_spans_files or (glob.escape(settings.spans_file) if settings.spans_file else None)
    if pattern:
        return SpanSource("files", pattern)
    if settings.applicationinsights_workspace_id:
        return SpanSource(
            "appinsights", workspace_id=settings.applicationinsights_workspace_id,
            client_id=settings.telemetry_identity()[1],
        )
    if settings.applicationinsights_connection_string:
        note = (
            f"spans are in Application Insights, but {names.APPINSIGHTS_WORKSPACE_SETTING} is not set: the "
            "timeline is drawn from the order's step rows (docs/observability.md has the query of one order's trace)"
        )
    else:
        note = "telemetry is off on this host (neither OTEL_SPANS_FILE nor TRACE_SPANS_FILES is set)"
    return SpanSource("none", note=note)


def _complete_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return text[: text.rfind("\n") + 1].splitlines()  # a line still being written waits for the next read


def _parse(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("attributes"), dict) else None


def order_spans(order_id: str, spans: SpanSource) -> tuple[list[dict[str, Any]], bool]:
    """The order's spans, by start time, at most :data:`MAX_SPANS`; and whether there were more."""
    lines = [line for path in spans.files() for line in _complete_lines(path)]
    own = [r for line in lines if order_id in line and (r := _parse(line))]
    trace_ids = {r["trace_id"] for r in own if r["attributes"].get(names.ATTR_ORDER_ID) == order_id}
    found: dict[str, dict[str, Any]] = {}
    for line in lines:
        if any(trace_id in line for trace_id in trace_ids):
            record = _parse(line)
            if record and record.get("trace_id") in trace_ids:
                found.setdefault(record.get("span_id") or str(len(found)), record)
    ordered = sorted(found.values(), key=lambda r: (r.get("start") or "", r.get("end") or ""))
    return ordered[:MAX_SPANS], len(ordered) > MAX_SPANS


# --- Azure: Application Insights, through its Log Analytics workspace ---------------------

#: Spans read before the order's creation (a client's span) and after its last write
#: (telemetry is stamped by each host's clock, which may drift a little).
QUERY_MARGIN = timedelta(minutes=15)
#: How long the workspace may take to answer, in seconds (the page waits for it).
QUERY_TIMEOUT_SECONDS = 30
_TRACE_PARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_INT_ATTRIBUTES = (names.ATTR_ATTEMPT, "http.response.status_code")


def trace_id_of(trace_parent: str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` (the state row's ``TraceParent``), or None."""
    match = _TRACE_PARENT.match((trace_parent or "").strip().lower())
    return match.group(1) if match and match.group(1) != "0" * 32 else None


def _kql_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def appinsights_query(order_id: str, trace_id: str | None) -> str:
    """The KQL of one order's spans: every row of its traces (the state row's trace, and
    any other trace with a span naming the order), by start time, one more than
    :data:`MAX_SPANS` (to tell a truncated reply)."""
    own = f'tostring(Properties["{names.ATTR_ORDER_ID}"]) == {_kql_string(order_id)}'
    match = f"OperationId == {_kql_string(trace_id)} or {own}" if trace_id else own
    return (
        "let traces = union AppRequests, AppDependencies\n"
        f"| where {match}\n"
        "| distinct OperationId;\n"
        "union withsource=SourceTable AppRequests, AppDependencies\n"
        "| where OperationId in (traces)\n"
        "| project SourceTable, TimeGenerated, Name, OperationId, Id, ParentId, DurationMs, Success,\n"
        "          DependencyType, Properties, AppRoleName, AppRoleInstance\n"
        "| order by TimeGenerated asc\n"
        f"| take {MAX_SPANS + 1}"
    )


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _attributes(properties: Any) -> dict[str, Any]:
    if isinstance(properties, str):  # a dynamic column may arrive as its JSON text
        try:
            properties = json.loads(properties) if properties else {}
        except ValueError:
            properties = {}
    attributes = dict(properties) if isinstance(properties, Mapping) else {}
    for name in _INT_ATTRIBUTES:  # custom dimensions are strings: the numbers the app recorded
        value = attributes.get(name)
        if isinstance(value, str) and value.isdigit():
            attributes[name] = int(value)
    return attributes


def _kind(row: Mapping[str, Any]) -> str:
    # The exporter writes SERVER and CONSUMER spans to requests (the app's are CONSUMER:
    # docs/observability.md), the others to dependencies: INTERNAL ones typed "InProc",
    # PRODUCER ones "Queue Message | ...", CLIENT ones by what they called ("HTTP", ...).
    if row.get("SourceTable") == "AppRequests":
        return "CONSUMER"
    kind = str(row.get("DependencyType") or "")
    if kind.startswith("InProc"):
        return "INTERNAL"
    if kind.startswith("Queue Message"):
        return "PRODUCER"
    return "CLIENT"


def span_from_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One row of ``AppRequests`` or ``AppDependencies`` (by the columns of
    :func:`appinsights_query`) as the spans files hold a span (docs/observability.md):
    ``OperationId`` is the trace id, ``Id`` the span id, ``ParentId`` the parent's,
    ``TimeGenerated`` the start, ``Properties`` the attributes, ``AppRoleInstance`` the host."""
    trace_id = row.get("OperationId")
    parent = row.get("ParentId") or None
    duration = float(row.get("DurationMs") or 0.0)
    start = row.get("TimeGenerated")
    start = start if isinstance(start, datetime) or start is None else datetime.fromisoformat(str(start))
    success = row.get("Success")
    failed = success is False or str(success).strip().lower() == "false"
    return {
        "name": row.get("Name"),
        "kind": _kind(row),
        "trace_id": trace_id,
        "span_id": row.get("Id"),
        "parent_span_id": None if parent == trace_id else parent,  # a root's parent is its operation
        "start": _iso(start),
        "end": _iso(start + timedelta(milliseconds=duration)) if start is not None else None,
        "duration_ms": round(duration, 3),
        "status": "ERROR" if failed else "UNSET",
        "attributes": _attributes(row.get("Properties")),
        "service": row.get("AppRoleName"),
        "instance": row.get("AppRoleInstance"),
    }


@lru_cache(maxsize=4)
def _logs_client(client_id: str | None):
    from adapters.clients import logs_query_client

    return logs_query_client(client_id)


def appinsights_spans(
    state, spans: SpanSource, *, now: datetime, client=None
) -> tuple[list[dict[str, Any]], bool, str | None]:
    """The order's spans from the workspace, by start time, at most :data:`MAX_SPANS`;
    whether there were more; and a note when the workspace answered only in part. The
    query spans the order's lifetime (``CreatedAt`` to ``UpdatedAt``, or now while it is
    in flight) and :data:`QUERY_MARGIN` either side. Raises what the query raises."""
    from azure.monitor.query import LogsQueryStatus

    end = state.updated_at if state.process_state.terminal else max(now, state.updated_at)
    result = (client or _logs_client(spans.client_id)).query_workspace(
        spans.workspace_id,
        appinsights_query(state.order_id, trace_id_of(state.trace_parent)),
        timespan=(state.created_at - QUERY_MARGIN, end + QUERY_MARGIN),
        server_timeout=QUERY_TIMEOUT_SECONDS,
    )
    note = None
    if result.status == LogsQueryStatus.SUCCESS:
        tables = result.tables
    elif result.status == LogsQueryStatus.PARTIAL:
        tables = result.partial_data
        note = f"Application Insights answered in part ({result.partial_error}): some spans may be missing"
    else:
        raise RuntimeError(f"the query failed: {getattr(result, 'error', result.status)}")
    rows = [dict(zip(table.columns, row, strict=False)) for table in tables for row in table.rows]
    found = [span_from_row(row) for row in rows]
    found.sort(key=lambda r: (r.get("start") or "", r.get("end") or ""))
    return found[:MAX_SPANS], len(found) > MAX_SPANS, note
