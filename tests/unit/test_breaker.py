"""The circuit breaker's states, on a clock the test moves (no sleeps): it opens on a
failure ratio over a sampling window of distinct requests, never on a few requests that
fail, and its half-open trial goes to a request that has not just failed."""

import pytest

from agents.breaker import BreakerOpen, BreakerOptions, BreakerState, CircuitBreaker

OPTIONS = BreakerOptions(failure_ratio=0.5, minimum_throughput=4, sampling_seconds=10, open_seconds=30, jitter=0.25)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(clock, fraction: float = 0.0, options: BreakerOptions = OPTIONS, changes: list | None = None):
    on_change = None if changes is None else (lambda service, state: changes.append((service, state)))
    return CircuitBreaker("payments", options, clock=clock, random_fraction=lambda: fraction, on_change=on_change)


def fail(b: CircuitBreaker, *requests: str) -> None:
    for request in requests:
        b.before_call(request)
        b.failed(request)


def opened(clock) -> CircuitBreaker:
    b = breaker(clock)
    fail(b, "a", "b", "c", "d")
    assert b.state is BreakerState.OPEN
    return b


def test_it_opens_when_enough_distinct_requests_mostly_fail_and_then_refuses_calls():
    clock = Clock()
    changes: list = []
    b = breaker(clock, changes=changes)
    fail(b, "a", "b", "c")
    assert b.state is BreakerState.CLOSED  # 3 requests: below the minimum throughput of 4
    fail(b, "d")
    assert b.state is BreakerState.OPEN  # 4 of 4 failing
    clock.now += 10
    with pytest.raises(BreakerOpen) as refused:
        b.before_call("e")
    assert refused.value.retry_after == pytest.approx(20)
    assert b.changes == {"open": 1} and changes == [("payments", BreakerState.OPEN)]


def test_one_bad_request_never_opens_it_however_often_it_retries():
    clock = Clock()
    b = breaker(clock)
    fail(b, *["bad"] * 50)
    assert b.state is BreakerState.CLOSED


def test_a_few_failing_requests_among_many_that_succeed_do_not_open_it():
    clock = Clock()
    b = breaker(clock)
    for n in range(6):
        b.before_call(f"good-{n}")
        b.succeeded(f"good-{n}")
    for _ in range(10):  # three bad requests, each retrying
        fail(b, "bad-1", "bad-2", "bad-3")
        clock.now += 0.1
    assert b.state is BreakerState.CLOSED  # 3 failing of 9 requests: below the ratio 0.5
    fail(b, "bad-4", "bad-5")
    assert b.state is BreakerState.CLOSED  # 5 of 11
    fail(b, "bad-6")
    assert b.state is BreakerState.OPEN  # 6 of 12: half the requests fail now


def test_a_request_counts_once_as_its_last_call_a_retry_that_worked_is_not_failing():
    clock = Clock()
    b = breaker(clock)
    for request in ("a", "b", "c"):
        fail(b, request)
        b.before_call(request)
        b.succeeded(request)  # its retry worked
    fail(b, "d")
    # Counting calls, 4 of 7 failed; counting requests, 1 of 4 is failing.
    assert b.state is BreakerState.CLOSED


def test_only_the_sampling_window_counts():
    clock = Clock()
    b = breaker(clock)
    fail(b, "a", "b", "c")
    clock.now += 11  # they leave the window
    fail(b, "d", "e", "f")
    assert b.state is BreakerState.CLOSED  # 3 requests in the window
    fail(b, "g")
    assert b.state is BreakerState.OPEN


def test_after_the_open_time_one_trial_goes_and_its_success_closes_it_with_a_fresh_window():
    clock = Clock()
    b = opened(clock)
    clock.now += 30
    assert b.state is BreakerState.HALF_OPEN
    b.before_call("e")  # the trial
    with pytest.raises(BreakerOpen):
        b.before_call("f")  # only one at a time
    b.succeeded("e")
    assert b.state is BreakerState.CLOSED
    fail(b, "a", "b", "c")  # the failures before the opening are forgotten
    assert b.state is BreakerState.CLOSED
    assert b.changes == {"open": 1, "half_open": 1, "closed": 1}


def test_a_failed_trial_opens_it_again_for_a_full_period():
    clock = Clock()
    b = opened(clock)
    clock.now += 31
    fail(b, "e")
    assert b.state is BreakerState.OPEN
    clock.now += 29
    with pytest.raises(BreakerOpen):
        b.before_call("f")
    clock.now += 1
    b.before_call("f")  # the next period's trial


def test_the_trial_goes_to_a_request_that_has_not_just_failed_when_another_waits():
    clock = Clock()
    b = opened(clock)  # a, b, c, d failed
    clock.now += 5
    with pytest.raises(BreakerOpen):
        b.before_call("fresh")  # refused while open: it waits, due back at the open time's end
    clock.now += 25
    with pytest.raises(BreakerOpen) as gave_way:
        b.before_call("a")  # half-open, but a has just failed and fresh is due back
    assert gave_way.value.retry_after == pytest.approx(1)
    assert b.state is BreakerState.HALF_OPEN
    b.before_call("fresh")  # the trial
    b.succeeded("fresh")
    assert b.state is BreakerState.CLOSED
    b.before_call("a")


def test_a_failed_request_gives_way_once_per_period_and_takes_the_trial_when_nobody_waits():
    clock = Clock()
    b = opened(clock)
    clock.now += 5
    with pytest.raises(BreakerOpen):
        b.before_call("fresh")
    clock.now += 25
    with pytest.raises(BreakerOpen):
        b.before_call("a")
    clock.now += 1
    b.before_call("a")  # fresh did not come back (another host took it): a is not held again
    b.failed("a")
    assert b.state is BreakerState.OPEN

    clock2 = Clock()
    alone = opened(clock2)  # nobody else waits
    clock2.now += 30
    alone.before_call("a")  # the failed request may take the trial
    alone.succeeded("a")
    assert alone.state is BreakerState.CLOSED


def test_a_request_overdue_by_more_than_an_open_period_is_not_waited_for():
    clock = Clock()
    b = opened(clock)
    with pytest.raises(BreakerOpen):
        b.before_call("fresh")  # due back at 130
    clock.now += 30 + 31  # fresh never came back
    b.before_call("a")  # the trial: nobody is due back


def test_a_trial_that_never_reports_is_given_to_another_after_an_open_period():
    clock = Clock()
    b = opened(clock)
    clock.now += 30
    b.before_call("e")  # the trial, whose call is never made (e.g. no bulkhead slot before its deadline)
    clock.now += 30
    with pytest.raises(BreakerOpen):
        b.before_call("f")  # still out
    clock.now += 1
    b.before_call("f")  # not held for ever
    b.succeeded("f")
    assert b.state is BreakerState.CLOSED


def test_the_wait_told_to_callers_is_spread_by_the_jitter():
    clock = Clock()
    b = breaker(clock, fraction=1.0)
    fail(b, "a", "b", "c", "d")
    clock.now += 10
    with pytest.raises(BreakerOpen) as refused:
        b.before_call("e")
    assert refused.value.retry_after == pytest.approx(20 + 0.25 * 30)


def test_a_call_that_does_not_count_is_refused_while_open_but_never_takes_the_trial():
    clock = Clock()
    b = opened(clock)
    with pytest.raises(BreakerOpen):
        b.refuse_if_open()  # open: a lookup waits too
    clock.now += 30
    b.refuse_if_open()  # half-open: a lookup may go...
    b.refuse_if_open()
    b.before_call("e")  # ...and the trial is still there for the action
    assert b.state is BreakerState.HALF_OPEN


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"minimum_throughput": 1}, "one request alone"),
        ({"failure_ratio": 0}, "failure_ratio"),
        ({"failure_ratio": 1.5}, "failure_ratio"),
        ({"sampling_seconds": 0}, "positive"),
    ],
)
def test_options_that_could_open_it_on_one_request_or_never_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        BreakerOptions(**fields)


def test_the_agents_build_their_breakers_from_the_app_settings(monkeypatch):
    from adapters.settings import Settings
    from agents.blueprint import breaker_options

    monkeypatch.setenv("AzureWebJobsStorage", "UseDevelopmentStorage=true")
    monkeypatch.setenv("ServiceBusConnection", "Endpoint=sb://localhost/;SharedAccessKeyName=k;SharedAccessKey=x")
    assert breaker_options(Settings()) == BreakerOptions()  # the settings' defaults are the options' own
    for name, value in {"BREAKER_FAILURE_RATIO": "0.8", "BREAKER_MINIMUM_THROUGHPUT": "20",
                        "BREAKER_SAMPLING_SECONDS": "60", "BREAKER_OPEN_SECONDS": "5"}.items():
        monkeypatch.setenv(name, value)
    assert breaker_options(Settings()) == BreakerOptions(
        failure_ratio=0.8, minimum_throughput=20, sampling_seconds=60, open_seconds=5,
    )
    monkeypatch.setenv("BREAKER_MINIMUM_THROUGHPUT", "1")  # one request alone could open it: refused
    with pytest.raises(ValueError, match="BREAKER_MINIMUM_THROUGHPUT"):
        Settings()


def test_a_call_confirmed_after_a_wait_goes_only_on_a_closed_breaker_or_as_the_half_open_trial():
    clock = Clock()
    b = breaker(clock)
    b.before_call("w")  # passed while closed, then waits (for a bulkhead slot)
    b.confirm("w")  # still closed: it may call
    fail(b, "a", "b", "c", "d")
    with pytest.raises(BreakerOpen):
        b.confirm("w")  # opened while it waited: it must not call
    clock.now += 30
    b.before_call("t")  # half-open: "t" takes the trial, then waits too
    b.confirm("t")
    with pytest.raises(BreakerOpen):
        b.confirm("w")  # not the trial


def test_a_breaker_change_is_published_off_the_callers_thread_and_a_storage_failure_reaches_no_call(monkeypatch):
    """The agent's breaker reports its change while it holds its lock, on the event loop:
    the services (built there first on an instance that runs only agents, with storage
    calls) are reached on the publishing thread, and a failure there stays there."""
    import threading

    from azure.core.exceptions import ServiceRequestError

    from agents import blueprint

    callers, done = [], threading.Event()

    def unreachable():
        callers.append(threading.current_thread().name)
        done.set()
        raise ServiceRequestError("storage unreachable")

    monkeypatch.setattr(blueprint, "services", unreachable)
    blueprint._breaker_changed("payments", BreakerState.OPEN)  # nothing raised here
    assert done.wait(10)
    assert callers and callers[0].startswith("breaker-publish")
