"""One order's time at light load, split into its functions and the hops between them (benchmarks/hops.py)."""

from __future__ import annotations

import json

import pytest

from benchmarks.hops import AGENT, NUDGE, RECORD, REMOTE, REQUEST, RESPONSE, SCHEDULE, SUBMIT, TOTAL, hops, read_spans
from core import names


def _span(name: str, order_id: str, start: float, end: float) -> str:
    def stamp(seconds: float) -> str:
        return f"2026-11-25T05:00:{seconds:09.6f}Z"

    return json.dumps({"name": name, "start": stamp(start), "end": stamp(end), "attributes": {names.ATTR_ORDER_ID: order_id}})


def _order(order_id: str) -> list[str]:
    """submit 0-0.02; nudge 0.03; schedule 0.05-0.06; each step: request 0.001, agent 0.004 (POST 0.002),
    response 0.002, complete_step 0.01."""
    lines = [_span(names.SPAN_SUBMIT, order_id, 0.0, 0.02), _span(names.SPAN_SCHEDULE, order_id, 0.05, 0.06)]
    end = 0.06
    for action in ("reserve", "charge", "ship"):
        agent = end + 0.001
        lines.append(_span(names.SPAN_AGENT, order_id, agent, agent + 0.004))
        lines.append(_span(f"POST /{action}", order_id, agent + 0.001, agent + 0.003))
        lines.append(_span(names.SPAN_RECORD, order_id, agent + 0.006, agent + 0.016))
        end = agent + 0.016
    return lines


def test_each_function_and_hop_of_an_order_is_measured_and_warm_up_or_retried_orders_are_left_out(tmp_path):
    retried = [*_order("o-2"), _span(names.SPAN_AGENT, "o-2", 1.0, 1.1)]  # a step that ran twice: not the light path
    spans = tmp_path / "spans-host-1.jsonl"
    spans.write_text("\n".join([*_order("o-1"), *_order("warm1-1"), *retried, ""]))

    rows = hops(read_spans(spans, skip_prefix="warm"))

    assert len(rows[TOTAL]) == 1
    expected = {SUBMIT: [0.02], NUDGE: [0.03], SCHEDULE: [0.01], REQUEST: [0.001] * 3, AGENT: [0.004] * 3,
                REMOTE: [0.002] * 3, RESPONSE: [0.002] * 3, RECORD: [0.01] * 3, TOTAL: [0.02 + 0.03 + 0.01 + 3 * 0.017]}
    for row, values in expected.items():
        assert rows[row] == pytest.approx(values, abs=1e-6), row
