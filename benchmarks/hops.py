"""Where one order's time goes at light load: its functions and the hops between them.

``python -m benchmarks --phases latency --keep-logs`` keeps the host's spans (one JSON
line per span, ``spans-host-1.jsonl``); ``python -m benchmarks.hops SPANS [--skip warm]``
reads them and prints, over the orders whose three steps all ran once, p50 and p95 of each
function's span and of each hop: the nudge (``submit_order`` done → ``schedule_order``
started: the host's queue output, the wake-up of its listener and the poll), each agent
request and each response over Service Bus (one function done → the next started). A hop
is the time between two spans on the host's clock; the orders queue's own hop (the send →
``submit_order``) is not in the spans (the latency phase's "submission → state row"
covers it).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from adapters import telemetry
from core import names
from devtools.stats import percentile

SUBMIT = "submit_order (function)"
NUDGE = "nudge hop: output send + wake-up + poll"
SCHEDULE = "schedule_order (function: first claim + request)"
REQUEST = "agent request hop (Service Bus)"
AGENT = "agent (function, remote call included)"
REMOTE = "  of which the remote's POST"
RESPONSE = "agent response hop (Service Bus)"
RECORD = "complete_step (function: transaction + next request)"
TOTAL = "submit_order start → last step recorded"
ROWS = (SUBMIT, NUDGE, SCHEDULE, REQUEST, AGENT, REMOTE, RESPONSE, RECORD, TOTAL)


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def read_spans(path: Path, *, skip_prefix: str = "warm") -> dict[str, dict[str, list[tuple[float, float]]]]:
    """order id -> span name -> [(start, end)] in start order, orders whose id starts with ``skip_prefix`` left out."""
    found: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for span in telemetry.read_json_lines([path]):
        order_id = span.get("attributes", {}).get(names.ATTR_ORDER_ID)
        if not order_id or (skip_prefix and order_id.startswith(skip_prefix)):
            continue
        found[order_id][span["name"]].append((_seconds(span["start"]), _seconds(span["end"])))
    for spans in found.values():
        for items in spans.values():
            items.sort()
    return found


def hops(orders: dict[str, dict[str, list[tuple[float, float]]]], steps: int = 3) -> dict[str, list[float]]:
    """Seconds per row of :data:`ROWS`, one value per order (per step for the step rows)."""
    rows: dict[str, list[float]] = {row: [] for row in ROWS}
    for spans in orders.values():
        submit, schedule = spans.get(names.SPAN_SUBMIT, []), spans.get(names.SPAN_SCHEDULE, [])
        agents, records = spans.get(names.SPAN_AGENT, []), spans.get(names.SPAN_RECORD, [])
        posts = sorted(item for name, items in spans.items() if name.startswith("POST /") for item in items)
        if len(submit) != 1 or len(schedule) != 1 or len(agents) != steps or len(records) != steps:
            continue  # retried, cancelled or unfinished: not the light-load path
        rows[SUBMIT].append(submit[0][1] - submit[0][0])
        rows[NUDGE].append(schedule[0][0] - submit[0][1])
        rows[SCHEDULE].append(schedule[0][1] - schedule[0][0])
        before = schedule[0]
        for step in range(steps):
            rows[REQUEST].append(agents[step][0] - before[1])
            rows[AGENT].append(agents[step][1] - agents[step][0])
            if len(posts) == steps:
                rows[REMOTE].append(posts[step][1] - posts[step][0])
            rows[RESPONSE].append(records[step][0] - agents[step][1])
            rows[RECORD].append(records[step][1] - records[step][0])
            before = records[step]
        rows[TOTAL].append(records[-1][1] - submit[0][0])
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spans", type=Path, help="a host's spans-host-N.jsonl (make bench's --keep-logs)")
    parser.add_argument("--skip", default="warm", help="leave out orders whose id starts with this (warm-up)")
    args = parser.parse_args(argv)
    rows = hops(read_spans(args.spans, skip_prefix=args.skip))
    print(f"{len(rows[TOTAL])} orders")
    for row, values in rows.items():
        if values:
            print(f"{row:55s} p50 {percentile(values, 50) * 1000:7.1f} ms   "
                  f"p95 {percentile(values, 95) * 1000:7.1f} ms   n={len(values)}")


if __name__ == "__main__":
    main()
