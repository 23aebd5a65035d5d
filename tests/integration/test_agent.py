"""The agent against the fake remote service over real HTTP: retries, Retry-After,
permanent failures, the deadline, and a stable idempotency key."""

from __future__ import annotations

import time
from datetime import timedelta

from agents import agent
from agents.remote import RemoteClient, RetryPolicy
from core.models import STEP, AgentRequest, Outcome, idempotency_key, utcnow

FAST = RetryPolicy(max_calls=6, backoff_initial=0.01, backoff_max=0.05, call_timeout=5.0)


def request(order_id: str = "o-1", *, seconds: float = 10.0, attempt: int = 1) -> AgentRequest:
    return AgentRequest(
        order_id=order_id,
        step=STEP,
        attempt=attempt,
        complete_by=utcnow() + timedelta(seconds=seconds),
        idempotency_key=idempotency_key(order_id, STEP),
        payload={"order_id": order_id},
    )


class RecordingSleep:
    """Real sleeping, remembering how long each wait was."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        time.sleep(seconds)


def test_transient_faults_are_retried_and_applied_once(fake_remote):
    fake_remote.set_faults(script={"o-1": ["transient", "drop", "transient"]})
    response = agent.run(request(), remote=RemoteClient(fake_remote.url, FAST), now=utcnow)
    assert response.outcome is Outcome.SUCCEEDED and response.result["order_id"] == "o-1"
    effects = fake_remote.effects()
    assert effects["calls"] == 4
    assert effects["by_key"] == {idempotency_key("o-1", STEP): 1}


def test_retry_after_is_honoured(fake_remote):
    fake_remote.set_faults(script={"o-1": ["throttle"]}, retry_after_seconds=1)
    sleep = RecordingSleep()
    response = agent.run(request(), remote=RemoteClient(fake_remote.url, FAST, sleep=sleep), now=utcnow)
    assert response.outcome is Outcome.SUCCEEDED
    assert sleep.waits and sleep.waits[0] >= 1.0


def test_permanent_failure_is_not_retried(fake_remote):
    fake_remote.set_faults(script={"o-1": ["always:permanent"]})
    response = agent.run(request(), remote=RemoteClient(fake_remote.url, FAST), now=utcnow)
    assert response.outcome is Outcome.FAILED_PERMANENT and "422" in response.error
    assert fake_remote.effects()["calls"] == 1
    assert fake_remote.effects()["total"] == 0


def test_nothing_is_sent_when_the_deadline_passes_during_retries(fake_remote):
    fake_remote.set_faults(script={"o-1": ["always:hang"]}, slow_seconds=30)
    started = time.monotonic()
    response = agent.run(request(seconds=1.5), remote=RemoteClient(fake_remote.url, FAST), now=utcnow)
    elapsed = time.monotonic() - started
    assert response is None
    assert elapsed < 2.5, f"the agent kept going {elapsed:.1f}s past a 1.5s deadline"
    assert fake_remote.effects()["total"] == 0


def test_a_request_arriving_after_complete_by_is_not_acted_on(fake_remote):
    response = agent.run(request(seconds=-1), remote=RemoteClient(fake_remote.url, FAST), now=utcnow)
    assert response is None
    assert fake_remote.effects()["calls"] == 0


def test_calls_run_out_before_the_deadline_sends_nothing(fake_remote):
    fake_remote.set_faults(script={"o-1": ["always:transient"]})
    policy = RetryPolicy(max_calls=3, backoff_initial=0.01, backoff_max=0.02, call_timeout=5.0)
    assert agent.run(request(), remote=RemoteClient(fake_remote.url, policy), now=utcnow) is None
    assert fake_remote.effects()["calls"] == 3


def test_the_idempotency_key_is_stable_across_supervisor_reruns(fake_remote):
    """A response lost after the effect: the re-run (new attempt) gets the first result."""
    fake_remote.set_faults(script={"o-1": ["slow"]}, slow_seconds=5)
    first = agent.run(request(seconds=1.0, attempt=1), remote=RemoteClient(fake_remote.url, FAST), now=utcnow)
    assert first is None  # the effect was applied, but the answer came too late
    again = agent.run(request(seconds=5.0, attempt=2), remote=RemoteClient(fake_remote.url, FAST), now=utcnow)
    assert again.outcome is Outcome.SUCCEEDED and again.attempt == 2
    assert fake_remote.effects()["by_order"] == {"o-1": 1}
