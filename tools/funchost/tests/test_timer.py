"""Timer triggers through a real host process: a seconds schedule from an app setting, run_on_startup."""

from __future__ import annotations

import itertools
from datetime import datetime

from .support import APP_DIR, eventually, only, records


def test_a_seconds_schedule_from_a_setting_fires_on_time_and_run_on_startup_fires_once(funchost, tmp_path):
    env = {"FH_RECORD_DIR": str(tmp_path), "FH_TIMER_SCHEDULE": "*/2 * * * * *", **only("tick", "tick_on_startup")}
    (host,) = funchost.start(APP_DIR, env=env)

    ticks = eventually(
        lambda: records(tmp_path, "tick")[2:] and records(tmp_path, "tick"), timeout=15, what="three ticks"
    )
    times = [datetime.fromisoformat(t["at"]) for t in ticks[:3]]
    for at in times:
        # On an even second, a little after the boundary (the function records its own start).
        assert at.second % 2 == 0 and at.microsecond < 500_000, at
    assert [round((b - a).total_seconds()) for a, b in itertools.pairwise(times)] == [2, 2]
    assert all(t["past_due"] is False and t["type"] == "TimerRequest" for t in ticks)

    (startup,) = records(tmp_path, "tick_on_startup")
    assert startup["past_due"] is False
    # At start-up, not on its yearly schedule. Not necessarily before the other timer's
    # first tick: two timers' threads start together, and a start a few milliseconds
    # before an even second lets that tick go first (Azure orders them no more).
    assert datetime.fromisoformat(startup["at"]) < times[1]
    assert 'schedule="*/2 * * * * *"' in host.log_text()


def test_a_run_that_outlasts_the_interval_is_followed_at_once_by_the_occurrence_it_overran(funchost, tmp_path):
    """As Azure's TimerListener: the next occurrence is reckoned from when a run started, so
    the one a long run overran fires as soon as it ends (one catch-up, not past due), then
    the schedule goes on; runs never overlap."""
    env = {"FH_RECORD_DIR": str(tmp_path), "FH_TIMER_SCHEDULE": "*/2 * * * * *", "FH_SLOW_TICK_SECONDS": "2.6",
           **only("slow_tick")}
    funchost.start(APP_DIR, env=env)
    runs = eventually(lambda: len(records(tmp_path, "slow_tick", "start")) >= 3 and records(tmp_path, "slow_tick"),
                      timeout=20, what="three runs")
    starts = [datetime.fromisoformat(r["at"]) for r in runs if r["event"] == "start"]
    first_done = next(datetime.fromisoformat(r["at"]) for r in runs if r["event"] == "done")
    assert starts[1] >= first_done  # no overlap
    assert (starts[1] - first_done).total_seconds() < 0.5, (first_done, starts[1])  # at once, not at the next even second
    assert all(r["past_due"] is False for r in runs if r["event"] == "start")
