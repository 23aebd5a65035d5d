"""benchmarks/misses.py: each counted missed deadline classified from spans as the hosts write them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from benchmarks.misses import ANSWERED_IN_TIME_RECORDED_LATE, NO_ANSWER, classify

T0 = datetime(2026, 11, 25, 2, 0, tzinfo=UTC)


def span(name: str, order: str, attempt: int, start: float, end: float | None = None, **attributes) -> str:
    at = lambda seconds: (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")  # noqa: E731
    return json.dumps({"name": name, "start": at(start), "end": at(start if end is None else end),
                       "attributes": {"order.id": order, "order.attempt": attempt, **attributes}})


def test_a_miss_answered_in_time_but_recorded_late_is_told_from_the_remotes_own_failure(tmp_path):
    (tmp_path / "spans-host-1.jsonl").write_text("\n".join([
        # o-1: answered 2 s after its claim, recorded 40 s later: the app's plumbing.
        span("order.claim", "o-1", 1, 0), span("agent.run", "o-1", 1, 1, 2, **{"order.outcome": "succeeded"}),
        span("order.record", "o-1", 1, 42), span("supervisor.retry", "o-1", 1, 13, **{"order.outcome": "retry"}),
        # o-2: its agent's calls ran out: the remote's failure, counted by its policy.
        span("order.compensate", "o-2", 4, 0), span("agent.run", "o-2", 4, 1, 12, **{"order.outcome": "no_response"}),
        span("supervisor.give_up", "o-2", 4, 13, **{"order.outcome": "give_up"}),
        # a supervisor that lost the race counted nothing; a line cut short by a killed host is skipped.
        span("supervisor.retry", "o-2", 4, 13, **{"order.outcome": "lost_race"}), '{"name": "order.cl',
    ]))
    (tmp_path / "spans-host-2.jsonl").write_text(span("supervisor.retry", "o-3", 2, 20, **{"order.outcome": "retry"}))
    assert classify(tmp_path, step_timeout=12) == {
        "retry": {ANSWERED_IN_TIME_RECORDED_LATE: 1, "unknown": 1}, "give_up": {NO_ANSWER: 1},
    }
