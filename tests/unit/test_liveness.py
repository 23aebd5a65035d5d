"""The liveness bound's formula (core/liveness.py), worked by hand for small policies."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from core import liveness
from core.liveness import Timing
from core.workflow import ORDER_WORKFLOW, Kind, StepPolicy

S = timedelta(seconds=1)
TIMING = Timing(
    supervisor_interval=2 * S, pending_timeout=5 * S, backoff_base=1 * S, backoff_cap=3 * S,
    breaker_open=10 * S, breaker_jitter=0.5,
)
DEFAULTS = StepPolicy(timeout_seconds=4, max_failures=3, agent_max_calls=2, agent_backoff_initial=0.1, agent_backoff_max=1)


def test_line_bound_is_attempts_plus_backoffs():
    # 3 attempts of (T 4 + 2S 4 + P 5) = 39, backoffs after failures 1 and 2: 1 + 2.
    assert liveness.line_bound(DEFAULTS, TIMING) == 42 * S


def test_the_response_grace_adds_to_every_attempt():
    # Each of the 3 attempts also waits G = 6 s past its deadline for its answer: 42 + 18.
    assert liveness.line_bound(DEFAULTS, replace(TIMING, response_grace=6 * S)) == 60 * S


def test_line_bound_needs_a_resolved_policy():
    with pytest.raises(ValueError, match="resolved"):
        liveness.line_bound(StepPolicy(), TIMING)


def test_remaining_lines_after_a_failing_action_include_every_undo():
    assert liveness.remaining_lines(ORDER_WORKFLOW, 1, Kind.ACTION) == [
        (1, Kind.ACTION), (2, Kind.ACTION), (1, Kind.COMPENSATION), (0, Kind.COMPENSATION),
    ]
    assert liveness.remaining_lines(ORDER_WORKFLOW, 1, Kind.COMPENSATION) == [
        (1, Kind.COMPENSATION), (0, Kind.COMPENSATION),
    ]


def test_order_bound_sums_the_remaining_lines_and_the_outage():
    assert liveness.order_bound(ORDER_WORKFLOW, DEFAULTS, TIMING, step_index=1) == 4 * 42 * S
    # w = O 10 + j*O 5 + P 5 + S 2 = 22; payments has two remaining lines (charge, refund),
    # each held up by the outage and at most two waits (the one spanning the return, one
    # refusal in half-open).
    outage = 60 * S
    bound = liveness.order_bound(ORDER_WORKFLOW, DEFAULTS, TIMING, step_index=1, outage=outage, outage_remote="payments")
    assert bound == 4 * 42 * S + 2 * (outage + 2 * 22 * S)


@pytest.mark.parametrize(
    ("schedule", "seconds"), [("*/15 * * * * *", 15), ("*/1 * * * * *", 1), ("0 */5 * * * *", 300), ("*/45 * * * * *", 45)]
)
def test_supervisor_interval_from_the_schedule(schedule, seconds):
    assert liveness.supervisor_interval(schedule) == timedelta(seconds=seconds)


def test_supervisor_interval_refuses_other_forms():
    with pytest.raises(ValueError, match=r"\*/N"):
        liveness.supervisor_interval("0 0 * * * *")


def test_liveness_timing_reads_the_app_settings_and_the_agents_jitter(monkeypatch):
    from adapters.settings import Settings
    from agents.breaker import BreakerOptions
    from supervisor.supervision import liveness_timing

    monkeypatch.setenv("AzureWebJobsStorage", "UseDevelopmentStorage=true")
    monkeypatch.setenv("ServiceBusConnection", "Endpoint=sb://localhost/;SharedAccessKeyName=k;SharedAccessKey=x")
    monkeypatch.setenv("SUPERVISOR_SCHEDULE", "*/5 * * * * *")
    monkeypatch.setenv("PENDING_TIMEOUT_SECONDS", "7")
    monkeypatch.setenv("RETRY_BACKOFF_BASE_SECONDS", "0.5")
    monkeypatch.setenv("RETRY_BACKOFF_MAX_SECONDS", "4")
    monkeypatch.setenv("BREAKER_OPEN_SECONDS", "12")
    timing = liveness_timing(Settings())
    assert timing == Timing(
        supervisor_interval=5 * S, pending_timeout=7 * S, backoff_base=0.5 * S, backoff_cap=4 * S,
        breaker_open=12 * S, breaker_jitter=BreakerOptions().jitter,
    )
