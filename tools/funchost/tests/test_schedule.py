"""NCRONTAB with seconds and TimeSpan schedules, as the Functions timer trigger reads them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tools.funchost.schedule import CronSchedule, IntervalSchedule, ScheduleError, parse_schedule, parse_timespan


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def occurrences(expression: str, start: datetime, count: int) -> list[datetime]:
    schedule = parse_schedule(expression)
    found, current = [], start
    for _ in range(count):
        current = schedule.next_after(current)
        found.append(current)
    return found


def test_seconds_come_first():
    assert occurrences("*/15 * * * * *", at(2026, 1, 1, 0, 0, 7), 3) == [
        at(2026, 1, 1, 0, 0, 15),
        at(2026, 1, 1, 0, 0, 30),
        at(2026, 1, 1, 0, 0, 45),
    ]


def test_next_is_strictly_after_even_on_an_occurrence():
    assert parse_schedule("*/2 * * * * *").next_after(at(2026, 1, 1, 0, 0, 2)) == at(2026, 1, 1, 0, 0, 4)
    # Sub-second remainders do not make the same second count twice.
    assert parse_schedule("* * * * * *").next_after(at(2026, 1, 1, 0, 0, 2) + timedelta(microseconds=999)) == at(
        2026, 1, 1, 0, 0, 3
    )


def test_the_docs_examples():
    # Every five minutes; at 09:30 every day; every hour from 9 to 17 on weekdays.
    assert occurrences("0 */5 * * * *", at(2026, 3, 1, 10, 3, 0), 2) == [at(2026, 3, 1, 10, 5), at(2026, 3, 1, 10, 10)]
    assert occurrences("0 30 9 * * *", at(2026, 3, 1, 10, 0, 0), 1) == [at(2026, 3, 2, 9, 30)]
    # 2026-03-06 is a Friday: the next weekday hours after Friday 17:00 are Monday 9:00.
    assert occurrences("0 0 9-17 * * 1-5", at(2026, 3, 6, 17, 0, 0), 2) == [at(2026, 3, 9, 9), at(2026, 3, 9, 10)]


def test_lists_ranges_steps_and_names():
    schedule = CronSchedule.parse("0,30 5-10/5 0 1 Jan,jul sun-sat")
    assert schedule.seconds == {0, 30}
    assert schedule.minutes == {5, 10}
    assert schedule.months == {1, 7}
    assert schedule.days_of_week == set(range(7))


def test_day_of_month_and_day_of_week_must_both_match_as_in_ncrontab():
    # The 13th that is a Friday: 2026-02-13, then 2026-03-13.
    assert occurrences("0 0 0 13 * 5", at(2026, 1, 1), 2) == [at(2026, 2, 13), at(2026, 3, 13)]


def test_months_without_the_day_are_skipped():
    assert occurrences("0 0 0 31 * *", at(2026, 1, 31, 1), 2) == [at(2026, 3, 31), at(2026, 5, 31)]
    assert occurrences("0 0 12 29 2 *", at(2026, 1, 1), 1) == [at(2028, 2, 29, 12)]


@pytest.mark.parametrize(
    "expression",
    [
        "* * * * *",
        "60 * * * * *",
        "* * 24 * * *",
        "* * * 0 * *",
        "* * * * 13 *",
        "* * * * * 7",
        "*/0 * * * * *",
        "5-1 * * * * *",
        "x * * * * *",
        "1,,2 * * * * *",
    ],
)
def test_invalid_expressions_are_rejected(expression):
    with pytest.raises(ScheduleError):
        parse_schedule(expression)


def test_timespan_schedules_and_host_json_timespans():
    schedule = parse_schedule("00:00:05")
    assert isinstance(schedule, IntervalSchedule)
    assert schedule.next_after(at(2026, 1, 1)) == at(2026, 1, 1, 0, 0, 5)
    assert parse_timespan("1.02:03:04.5") == timedelta(days=1, hours=2, minutes=3, seconds=4.5)
    with pytest.raises(ValueError):
        parse_timespan("00:61:00")
    with pytest.raises(ScheduleError):
        parse_schedule("00:00:00")
