"""One order's spans, for the operator page's timeline (``GET /api/orders/{id}/trace``).

Where they are read from (:func:`source`):

- **the local stack**: the JSON lines files each host appends its spans to
  (adapters/telemetry.py, docs/observability.md): every host's, through the glob of the
  app setting ``TRACE_SPANS_FILES`` (the local stack sets it), else this host's own
  ``OTEL_SPANS_FILE``.
- **Azure**: none here. The spans are in Application Insights, which this app does not
  query; the page draws the order's timeline from its step rows instead and links to the
  Application Insights query of docs/observability.md.

An order's spans are those that carry its ``order.id``, and every other span of the same
traces (an order is one trace; a resubmit continues it). A line is parsed only when it
names the order id or one of its trace ids, so a long-running local stack's files cost a
text scan, not a JSON parse per span.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import names

#: The most spans one reply carries (an order's trace has a few dozen; a pathological one
#: that was retried for hours could have thousands).
MAX_SPANS = 2000


@dataclass(frozen=True)
class SpanSource:
    """Where an order's spans are read from: ``files`` (a glob pattern, or one path), or
    ``none`` with the reason."""

    kind: str
    pattern: str | None = None
    note: str | None = None

    def files(self) -> list[Path]:
        if not self.pattern:
            return []
        return sorted(Path(path) for path in glob.glob(self.pattern))


def source(settings) -> SpanSource:
    """The span source this app's settings name."""
    pattern = settings.trace_spans_files or (glob.escape(settings.spans_file) if settings.spans_file else None)
    if pattern:
        return SpanSource("files", pattern)
    if settings.applicationinsights_connection_string:
        note = (
            "spans are in Application Insights, which this page does not query: the timeline is drawn "
            "from the order's step rows (docs/observability.md has the query of one order's trace)"
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
