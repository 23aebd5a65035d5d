"""The operator page (``GET /api/ops``) and what it reads beside the status API, as plain
functions of their inputs (``api/blueprint.py`` binds them to HTTP routes).

- ``GET /api/ops``: the page, ``api/static/ops.html``; ``GET /api/ops/static/{name}``: its
  script and style and the vendored chart library (uPlot, its licence beside it). Files
  of that folder only, by name: no path reaches anything else.
- ``GET /api/ops/me``: who the page's caller is and what they may do (core/access.py):
  the page shows the resubmit buttons only to an operator.
- ``GET /api/ops/counts?hours=3``: orders per state over time, from the state store:
  the orders whose state row was last written in the window, by that state and by the
  minute it was written (ten minutes past six hours), and the in-flight orders now
  (the active index). A state row keeps an order's latest state only: an order
  resubmitted since counts where it stands now, at the time it got there.
- ``GET /api/orders/{id}/trace``: the order's spans (adapters/traces.py: the local
  spans files, or Application Insights in Azure), for its timeline: steps, attempts,
  retries, compensations, hosts.

Each takes the reader role (an operator may read too); refusals are the status API's
(api/orders.py): 400 for a bad id or parameter, 404 for an unknown order or file.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from adapters import traces
from adapters.store import OrderNotFound, StateStore
from api.orders import Reply, order_id_of, only, refused, whole_number
from core import access
from core.models import ProcessState, utcnow

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
#: The files the page is made of, by name, with their content types.
ASSETS = {
    "ops.js": "text/javascript",
    "ops-search.js": "text/javascript",
    "ops.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "uPlot.LICENSE": "text/plain",
}
#: The page and its files may load from this app only; nothing may frame it.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
    "Referrer-Policy": "same-origin",
}
DEFAULT_HOURS, MAX_HOURS = 3, 24
#: The most state rows one count reads (a busier window says so: ``truncated``).
MAX_COUNTED = 50_000
MAX_IN_FLIGHT = 5_000
COUNTS_PARAMETERS = ("hours",)


def page(base: str) -> Reply:
    """The page, its links under ``base`` (the route prefix, ``/api``)."""
    html = (STATIC / "ops.html").read_text(encoding="utf-8").replace("{{base}}", base)
    return Reply(200, html, dict(PAGE_HEADERS), mimetype="text/html")


def base_of(path: str) -> str:
    """The route prefix from the page's own path: ``/api/ops`` (or ``/api/ops/``) -> ``/api``."""
    stripped = path.rstrip("/")
    return stripped[: -len("/ops")] if stripped.lower().endswith("/ops") else ""


def asset(name: str | None) -> Reply:
    """One of the page's files; 404 for any other name."""
    if name not in ASSETS:
        return refused(404, "not_found", f"no file {name!r} (the page's files: {', '.join(ASSETS)})")
    return Reply(200, (STATIC / name).read_bytes(), dict(PAGE_HEADERS), mimetype=ASSETS[name])


def me(mode: access.ApiAuth, headers: Mapping[str, str]) -> Reply:
    """The caller: name, app roles and what they may do (the page hides what they may not)."""
    lowered = {key.lower(): value for key, value in headers.items()}
    platform_auth = os.environ.get(access.PLATFORM_AUTH_SETTING)
    name, roles = None, []
    if mode is access.ApiAuth.EASYAUTH:
        principal = access.Principal.from_header(lowered[access.PRINCIPAL_HEADER])  # checked by serve()
        name, roles = principal.name, sorted(principal.roles)
    return Reply(
        200,
        {
            "auth": mode.value,
            "name": name,
            "roles": roles,
            "can_read": access.check(mode, lowered, access.READ_ROLES, platform_auth=platform_auth) is None,
            "can_operate": access.check(mode, lowered, access.OPERATE_ROLES, platform_auth=platform_auth) is None,
        },
    )


def _hours(params: Mapping[str, str]) -> int:
    only(params, COUNTS_PARAMETERS)
    return whole_number("hours", params.get("hours"), default=DEFAULT_HOURS, most=MAX_HOURS)


def bucket_seconds(hours: int) -> int:
    return 60 if hours <= 6 else 600


def counts(params: Mapping[str, str], *, store: StateStore, now: datetime) -> Reply:
    """Orders per state over the last ``hours``, per bucket; and the in-flight orders now."""
    hours = _hours(params)
    step = bucket_seconds(hours)
    end = int(now.timestamp()) // step * step + step
    start = end - hours * 3600
    rows, truncated = store.states_updated_since(now - timedelta(hours=hours), limit=MAX_COUNTED)
    states = [state.value for state in ProcessState]
    series = {state: [0] * (hours * 3600 // step) for state in states}
    for _, state, updated_at in rows:
        index = (int(updated_at.timestamp()) - start) // step
        if 0 <= index < len(series[state.value]):
            series[state.value][index] += 1
    in_flight, more_in_flight = store.in_flight(limit=MAX_IN_FLIGHT)
    now_in_flight = Counter(s.process_state.value for s in in_flight)
    return Reply(
        200,
        {
            "hours": hours,
            "bucket_seconds": step,
            "times": list(range(start, end, step)),
            "series": series,
            "totals": {state: sum(values) for state, values in series.items()},
            "in_flight": {s.value: now_in_flight.get(s.value, 0) for s in ProcessState if not s.terminal},
            "truncated": truncated or more_in_flight,
        },
    )


def trace(
    order_id: str | None, *, store: StateStore, spans: traces.SpanSource, now: datetime | None = None
) -> Reply:
    """The order's spans by start time (``source``: where from; ``note``: why none, or
    why some may be missing). A query of Application Insights that fails answers no
    spans, ``source`` ``none`` and the reason: the page draws the step rows."""
    order_id = order_id_of(order_id)
    try:
        state = store.get(order_id)
    except OrderNotFound:
        return refused(404, "not_found", f"no order {order_id!r}")
    kind, note, found, truncated = spans.kind, spans.note, [], False
    if spans.kind == "files":
        found, truncated = traces.order_spans(order_id, spans)
    elif spans.kind == "appinsights":
        try:
            found, truncated, note = traces.appinsights_spans(state, spans, now=now or utcnow())
        except Exception as error:  # noqa: BLE001 - by design: the page falls back to the step rows
            log.warning("spans of order %s not read from Application Insights: %r", order_id, error)
            kind, note = "none", (
                f"Application Insights could not be queried ({type(error).__name__}: {str(error)[:300]}): "
                "the timeline is drawn from the order's step rows"
            )
    body: dict[str, Any] = {
        "order_id": order_id,
        "source": kind,
        "note": note,
        "trace_ids": sorted({span["trace_id"] for span in found if span.get("trace_id")}),
        "spans": found,
        "truncated": truncated,
    }
    return Reply(200, body)
