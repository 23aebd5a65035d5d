"""Calls made after their Complete-By are served as usual but counted as late, per service."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from devtools.fake_remote import LATE_TOLERANCE_SECONDS
from tests.fake_remote.client import call, reserve


def test_a_call_after_its_complete_by_is_served_and_counted_late(fake_remote):
    response = call(fake_remote.url, "o-1", "k", service="payments", action="charge",
                    complete_by=datetime.now(UTC) - timedelta(seconds=3))  # fmt: skip

    assert response.status_code == 200  # served as usual
    effects = fake_remote.effects()
    assert effects["late"] == 1
    assert {name: s["late"] for name, s in effects["services"].items()} == {"inventory": 0, "payments": 1, "shipping": 0}
    assert effects["total"] == 1


def test_calls_in_time_or_within_the_clock_tolerance_are_not_late(fake_remote):
    assert LATE_TOLERANCE_SECONDS == 1.0
    reserve(fake_remote.url, "o-1", "k-1", complete_by=datetime.now(UTC) + timedelta(seconds=5))
    # Complete-By just now: the call arrives a few ms after it, inside the tolerance.
    reserve(fake_remote.url, "o-2", "k-2", complete_by=datetime.now(UTC) + timedelta(milliseconds=20))

    assert fake_remote.effects()["late"] == 0


def test_late_calls_are_counted_whatever_their_outcome(fake_remote):
    fake_remote.set_faults(script={"o-1": ["transient"]})
    past = datetime.now(UTC) - timedelta(seconds=3)
    assert reserve(fake_remote.url, "o-1", "k-1", complete_by=past).status_code == 503
    assert reserve(fake_remote.url, "o-2", None, complete_by=past).status_code == 400
    assert call(fake_remote.url, "o-3", "k-3", action="release", complete_by=past).status_code == 200
    assert reserve(fake_remote.url, "o-4", "k-4", complete_by=None).status_code == 400  # no Complete-By: not late

    assert fake_remote.effects()["services"]["inventory"]["late"] == 3


def test_reset_clears_late_counts(fake_remote):
    reserve(fake_remote.url, "o-1", "k-1", complete_by=datetime.now(UTC) - timedelta(seconds=3))
    fake_remote.reset()
    assert fake_remote.effects()["late"] == 0
