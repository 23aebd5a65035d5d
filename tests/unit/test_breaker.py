"""The circuit breaker's states, on a clock the test moves."""

import pytest

from agents.breaker import BreakerOpen, BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(clock, fraction: float = 0.0) -> CircuitBreaker:
    return CircuitBreaker(
        "payments", failure_threshold=3, open_seconds=30, jitter=0.25, clock=clock, random_fraction=lambda: fraction
    )


def test_it_opens_after_the_threshold_of_failures_in_a_row_and_refuses_calls():
    clock = Clock()
    b = breaker(clock)
    for _ in range(2):
        b.before_call()
        b.failed()
    b.succeeded()  # a success in between starts the count again
    for _ in range(3):
        b.before_call()
        b.failed()
    assert b.state is BreakerState.OPEN
    clock.now += 10
    with pytest.raises(BreakerOpen) as refused:
        b.before_call()
    assert refused.value.retry_after == pytest.approx(20)
    assert b.changes == {"open": 1}


def test_after_the_open_time_one_trial_goes_and_its_success_closes_it():
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.failed()
    clock.now += 30
    assert b.state is BreakerState.HALF_OPEN
    b.before_call()  # the trial
    with pytest.raises(BreakerOpen):
        b.before_call()  # only one at a time
    b.succeeded()
    assert b.state is BreakerState.CLOSED
    b.before_call()
    assert b.changes == {"open": 1, "half_open": 1, "closed": 1}


def test_a_failed_trial_opens_it_again_for_a_full_period():
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.failed()
    clock.now += 31
    b.before_call()
    b.failed()
    assert b.state is BreakerState.OPEN
    clock.now += 29
    with pytest.raises(BreakerOpen):
        b.before_call()


def test_one_bad_request_cannot_open_it_however_often_it_retries():
    clock = Clock()
    b = breaker(clock)
    b.failed()
    for _ in range(10):
        b.failed(new_request=False)  # the same request retrying
    assert b.state is BreakerState.CLOSED
    b.failed()  # a second request fails: the calls in a row are enough now
    assert b.state is BreakerState.OPEN


def test_failed_calls_of_two_requests_open_it_at_the_threshold():
    clock = Clock()
    b = breaker(clock)
    b.failed()
    b.failed()  # two requests, two calls: below the threshold of 3
    assert b.state is BreakerState.CLOSED
    b.failed(new_request=False)  # a retry: the third call in a row
    assert b.state is BreakerState.OPEN


def test_a_retry_still_ends_the_trial_and_reopens():
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.failed()
    clock.now += 30
    b.before_call()  # a retry of a request that failed before takes the trial...
    b.failed(new_request=False)
    assert b.state is BreakerState.OPEN  # ...and its failure reopens: the trial is not stuck
    clock.now += 30
    b.before_call()  # the next period's trial goes
    b.succeeded()
    assert b.state is BreakerState.CLOSED


def test_the_wait_told_to_callers_is_spread_by_the_jitter():
    clock = Clock()
    b = breaker(clock, fraction=1.0)
    for _ in range(3):
        b.failed()
    clock.now += 10
    with pytest.raises(BreakerOpen) as refused:
        b.before_call()
    assert refused.value.retry_after == pytest.approx(20 + 0.25 * 30)


def test_a_call_that_does_not_count_is_refused_while_open_but_never_takes_the_trial():
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.failed()
    with pytest.raises(BreakerOpen):
        b.refuse_if_open()  # open: a lookup waits too
    clock.now += 30
    b.refuse_if_open()  # half-open: a lookup may go...
    b.refuse_if_open()
    b.before_call()  # ...and the trial is still there for the action
    assert b.state is BreakerState.HALF_OPEN
