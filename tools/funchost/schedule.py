"""Timer schedules as the Functions timer trigger reads them.

Two forms, as in Azure:

- NCRONTAB with seconds: six fields, ``{second} {minute} {hour} {day} {month} {day-of-week}``.
  Each field takes ``*``, a value, a range ``a-b``, a step ``*/n`` or ``a-b/n`` and
  comma-separated lists of those; months and days of week also take English names
  (``Jan``, ``Mon``). Day of week runs 0-6 with Sunday = 0. As in NCrontab (the
  library the Functions host uses), a time matches when *every* field matches:
  day-of-month and day-of-week are combined with AND, not cron's OR.
- A TimeSpan ``hh:mm:ss`` (or ``d.hh:mm:ss``): every interval, counted from when the
  listener starts (App Service plans only, in Azure).

Times are UTC (the Functions default when no time zone is configured).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]

# (name, lowest, highest, names or None)
_FIELDS = (
    ("second", 0, 59, None),
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day", 1, 31, None),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 6, _DAYS),
)

_TIMESPAN = re.compile(r"^(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,7}))?$")


class ScheduleError(ValueError):
    """The schedule is neither a six-field NCRONTAB expression nor a TimeSpan."""


def parse_timespan(text: str) -> timedelta:
    """Parse a .NET TimeSpan as host.json writes them: ``hh:mm:ss[.fffffff]`` or ``d.hh:mm:ss``."""
    match = _TIMESPAN.match(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a TimeSpan (expected hh:mm:ss or d.hh:mm:ss)")
    days, hours, minutes, seconds, fraction = match.groups()
    if int(minutes) > 59 or int(seconds) > 59:
        raise ValueError(f"{text!r} is not a TimeSpan: minutes and seconds run 0-59")
    micro = int((fraction or "0").ljust(7, "0")[:6])
    return timedelta(
        days=int(days or 0), hours=int(hours), minutes=int(minutes), seconds=int(seconds), microseconds=micro
    )


def _parse_value(token: str, name: str, low: int, high: int, names: list[str] | None) -> int:
    lowered = token.lower()
    if names and lowered[:3] in names and (len(lowered) == 3 or lowered.isalpha()):
        return names.index(lowered[:3]) + low
    if not token.isdigit():
        raise ScheduleError(f"{token!r} is not a valid {name}")
    value = int(token)
    if not low <= value <= high:
        raise ScheduleError(f"{name} {value} is out of range {low}-{high}")
    return value


def _parse_field(text: str, name: str, low: int, high: int, names: list[str] | None) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise ScheduleError(f"empty list element in {name} field {text!r}")
        step = 1
        if "/" in part:
            part, step_text = part.split("/", 1)
            if not step_text.isdigit() or int(step_text) == 0:
                raise ScheduleError(f"invalid step {step_text!r} in {name} field")
            step = int(step_text)
        if part == "*":
            start, end = low, high
        elif "-" in part:
            first, last = part.split("-", 1)
            start = _parse_value(first, name, low, high, names)
            end = _parse_value(last, name, low, high, names)
            if end < start:
                raise ScheduleError(f"range {part!r} runs backwards in {name} field")
        else:
            start = _parse_value(part, name, low, high, names)
            # NCrontab reads "5/15" as "from 5 to the end, every 15".
            end = high if step > 1 else start
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class CronSchedule:
    """A six-field NCRONTAB schedule."""

    expression: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    days_of_week: frozenset[int]

    @classmethod
    def parse(cls, expression: str) -> CronSchedule:
        tokens = expression.split()
        if len(tokens) != 6:
            raise ScheduleError(
                f"{expression!r} is not a valid NCRONTAB schedule: the Functions timer takes six fields, "
                "{second} {minute} {hour} {day} {month} {day-of-week}"
            )
        fields = [_parse_field(token, *spec) for token, spec in zip(tokens, _FIELDS)]
        return cls(expression, *fields)

    def next_after(self, after: datetime) -> datetime:
        """The first occurrence strictly after ``after`` (an aware datetime), in UTC."""
        start = after.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1)
        day = start.date()
        # Eight years covers every reachable date, 29 February on a given weekday included.
        for _ in range(366 * 8):
            # Python's weekday(): Monday = 0; NCRONTAB: Sunday = 0.
            if day.month in self.months and day.day in self.days and (day.weekday() + 1) % 7 in self.days_of_week:
                first_day = day == start.date()
                for hour in sorted(self.hours):
                    if first_day and hour < start.hour:
                        continue
                    first_hour = first_day and hour == start.hour
                    for minute in sorted(self.minutes):
                        if first_hour and minute < start.minute:
                            continue
                        first_minute = first_hour and minute == start.minute
                        for second in sorted(self.seconds):
                            if first_minute and second < start.second:
                                continue
                            return datetime(day.year, day.month, day.day, hour, minute, second, tzinfo=UTC)
            day += timedelta(days=1)
        raise ScheduleError(f"{self.expression!r} never occurs")


@dataclass(frozen=True)
class IntervalSchedule:
    """A TimeSpan schedule: every ``interval`` from the listener's start."""

    expression: str
    interval: timedelta

    def next_after(self, after: datetime) -> datetime:
        return after.astimezone(UTC) + self.interval


Schedule = CronSchedule | IntervalSchedule


def parse_schedule(expression: str) -> Schedule:
    """Parse a timer trigger's schedule (already resolved from ``%SETTING%``)."""
    text = expression.strip()
    if _TIMESPAN.match(text):
        interval = parse_timespan(text)
        if interval <= timedelta(0):
            raise ScheduleError(f"{expression!r}: a TimeSpan schedule must be positive")
        return IntervalSchedule(text, interval)
    return CronSchedule.parse(text)
