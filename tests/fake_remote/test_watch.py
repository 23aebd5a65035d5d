"""Watched calls: a test waits on a call's events and releases a held answer."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from devtools.fake_remote import FaultConfigError
from tests.fake_remote.client import call, reserve

#: Far longer than any of these tests: a held answer that comes back sooner was released.
HELD_SECONDS = 30


def test_a_slow_answer_is_held_until_released(fake_remote):
    fake_remote.set_faults(script={"o-1/reserve": ["slow"]}, slow_seconds=HELD_SECONDS)
    watch = fake_remote.watch("o-1/reserve")
    before = datetime.now(UTC)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(reserve, fake_remote.url, "o-1", "k-1", timeout=HELD_SECONDS)
        seen = watch.call(1, timeout=10)
        assert seen.applied.wait(10)  # applied before its answer, which is held
        assert fake_remote.net("o-1") == {"inventory": {"reserve": 1}}
        assert not seen.answered.is_set() and not answer.done()
        seen.release()
        response = answer.result(timeout=10)  # at once, not after HELD_SECONDS
    assert response.status_code == 200 and response.json()["action"] == "reserve"
    assert seen.answered.wait(10) and seen.outcome == "slow, applied, status=200"
    assert (seen.service, seen.step, seen.key, seen.attempt, seen.fault) == ("inventory", "reserve", "k-1", 1, "slow")
    assert before <= seen.arrived_at <= datetime.now(UTC) < seen.complete_by  # the client's default: a minute on


def test_a_released_hang_applies_and_answers_at_once(fake_remote):
    fake_remote.set_faults(script={"o-1/reserve": ["hang"]}, slow_seconds=HELD_SECONDS)
    watch = fake_remote.watch("o-1/reserve")
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(reserve, fake_remote.url, "o-1", "k-1", timeout=HELD_SECONDS)
        seen = watch.call(1, timeout=10)
        assert not seen.applied.is_set() and fake_remote.net("o-1") == {}  # hanging: nothing applied
        seen.release()
        assert answer.result(timeout=10).status_code == 200
    assert seen.applied.is_set() and fake_remote.net("o-1") == {"inventory": {"reserve": 1}}


def test_every_call_of_the_watched_action_is_seen_in_order_and_no_other(fake_remote):
    fake_remote.set_faults(script={"o-1/reserve": ["transient"]})
    watch = fake_remote.watch("o-1/reserve")
    assert reserve(fake_remote.url, "o-1", "k-1").status_code == 503
    assert reserve(fake_remote.url, "o-1", "k-1").status_code == 200
    assert reserve(fake_remote.url, "o-1", "k-1").status_code == 200  # a replay
    reserve(fake_remote.url, "o-2", "k-2")  # another order
    call(fake_remote.url, "o-1", "k-3", action="release")  # another route of the order
    call(fake_remote.url, "o-1", None)  # invalid (no key): not a call of the order's action

    first, second, third = watch.calls
    assert [c.fault for c in watch.calls] == ["transient", None, None]
    assert not first.applied.is_set() and first.outcome == "transient, not applied, status=503"
    assert second.applied.is_set() and second.outcome == "applied, status=200"
    assert third.applied.is_set() and third.outcome == "replayed, status=200"  # release() of a call not held: no-op
    third.release()
    with pytest.raises(TimeoutError, match="call 4 of o-1/reserve"):
        watch.call(4, timeout=0.1)


def test_a_watch_names_an_order_and_an_action_a_service_has(fake_remote):
    with pytest.raises(FaultConfigError, match="order id"):
        fake_remote.watch("o-1")
    with pytest.raises(FaultConfigError, match="no service has"):
        fake_remote.watch("o-1/teleport")
