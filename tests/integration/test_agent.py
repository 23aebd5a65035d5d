"""The agent against the fake remote service over real HTTP: retries, Retry-After,
permanent failures, the deadline, a stable idempotency key, and compensations."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from agents import agent
from agents.breaker import BreakerOptions, CircuitBreaker
from agents.remote import RemoteClient
from core import lifecycle
from core.models import AgentPolicy, AgentRequest, Context, Outcome, idempotency_key, utcnow
from core.workflow import ORDER_WORKFLOW, Kind

FAST = AgentPolicy(max_calls=6, backoff_initial=0.01, backoff_max=0.05)


def request(
    order_id: str = "o-1", *, seconds: float = 10.0, attempt: int = 1, policy: AgentPolicy = FAST,
    kind: Kind = Kind.ACTION, result=None,
) -> AgentRequest:
    """The reserve step (inventory) of an order, or its compensation."""
    step = ORDER_WORKFLOW.steps[0]
    action = step.action_of(kind)
    fence = lifecycle.new_order(order_id, ORDER_WORKFLOW, utcnow(), timedelta(seconds=30), None)
    return AgentRequest(
        order_id=order_id,
        step=step.name,
        kind=kind,
        action=action,
        remote=step.remote,
        attempt=attempt,
        complete_by=utcnow() + timedelta(seconds=seconds),
        idempotency_key=idempotency_key(order_id, step.name, action),
        policy=policy,
        result=result,
        lookup=step.lookup,
        context=Context(fence=fence, order={"order_id": order_id}),
    )


def inventory(fake_remote, **kwargs) -> RemoteClient:
    return RemoteClient(fake_remote.base_url("inventory"), call_timeout=5.0, **kwargs)


def run(request: AgentRequest, *, remote: RemoteClient, now=utcnow):
    """The async agent on an event loop of its own, as the worker runs it."""

    async def once():
        try:
            return await agent.run(request, remote=remote, now=now)
        finally:
            await remote.close()

    return asyncio.run(once())


class RecordingSleep:
    """Real (async) sleeping, remembering how long each wait was."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await asyncio.sleep(seconds)


def test_transient_faults_are_retried_and_applied_once(fake_remote):
    fake_remote.set_faults(script={"o-1": ["transient", "drop", "transient"]})
    response = run(request(), remote=inventory(fake_remote), now=utcnow)
    assert response.outcome is Outcome.SUCCEEDED and response.result["order_id"] == "o-1"
    effects = fake_remote.effects()
    assert effects["calls"] == 4
    assert effects["by_key"] == {idempotency_key("o-1", "reserve", "reserve"): 1}


def test_retry_after_is_honoured(fake_remote):
    fake_remote.set_faults(script={"o-1": ["throttle"]}, retry_after_seconds=1)
    sleep = RecordingSleep()
    response = run(request(), remote=inventory(fake_remote, sleep=sleep), now=utcnow)
    assert response.outcome is Outcome.SUCCEEDED
    assert sleep.waits and sleep.waits[0] >= 1.0


def test_permanent_failure_is_not_retried(fake_remote):
    fake_remote.set_faults(script={"o-1": ["always:permanent"]})
    response = run(request(), remote=inventory(fake_remote), now=utcnow)
    assert response.outcome is Outcome.FAILED_PERMANENT and "422" in response.error
    assert fake_remote.effects()["calls"] == 1
    assert fake_remote.effects()["total"] == 0


def test_nothing_is_sent_when_the_deadline_passes_during_retries(fake_remote):
    fake_remote.set_faults(script={"o-1": ["always:hang"]}, slow_seconds=30)
    started = time.monotonic()
    response = run(request(seconds=1.5), remote=inventory(fake_remote), now=utcnow)
    elapsed = time.monotonic() - started
    assert response is None
    assert elapsed < 2.5, f"the agent kept going {elapsed:.1f}s past a 1.5s deadline"
    assert fake_remote.effects()["total"] == 0


def test_a_request_arriving_after_complete_by_is_not_acted_on(fake_remote):
    response = run(request(seconds=-1), remote=inventory(fake_remote), now=utcnow)
    assert response is None
    assert fake_remote.effects()["calls"] == 0


def test_calls_run_out_before_the_deadline_sends_nothing(fake_remote):
    fake_remote.set_faults(script={"o-1": ["always:transient"]})
    policy = AgentPolicy(max_calls=3, backoff_initial=0.01, backoff_max=0.02)
    assert run(request(policy=policy), remote=inventory(fake_remote), now=utcnow) is None
    assert fake_remote.effects()["calls"] == 3


def test_the_idempotency_key_is_stable_across_supervisor_reruns(fake_remote):
    """A response lost after the effect: the re-run (new attempt) gets the first result."""
    fake_remote.set_faults(script={"o-1": ["slow"]}, slow_seconds=5)
    first = run(request(seconds=1.0, attempt=1), remote=inventory(fake_remote), now=utcnow)
    assert first is None  # the effect was applied, but the answer came too late
    again = run(request(seconds=5.0, attempt=2), remote=inventory(fake_remote), now=utcnow)
    assert again.outcome is Outcome.SUCCEEDED and again.attempt == 2
    assert fake_remote.effects()["by_order"] == {"o-1": 1}


def test_a_compensation_undoes_the_action_once_with_its_own_key(fake_remote):
    done = run(request(), remote=inventory(fake_remote), now=utcnow)
    undo = request(kind=Kind.COMPENSATION, result=done.result)
    assert undo.idempotency_key != request().idempotency_key
    undone = run(undo, remote=inventory(fake_remote), now=utcnow)
    assert undone.outcome is Outcome.SUCCEEDED and undone.kind is Kind.COMPENSATION
    assert run(undo, remote=inventory(fake_remote), now=utcnow).outcome is Outcome.SUCCEEDED  # a retry
    effects = fake_remote.effects()
    assert effects["services"]["inventory"]["undone"] == {"o-1": ["release"]}
    assert fake_remote.net("o-1") == {"inventory": {"reserve": 0}}
    assert (effects["twice"], effects["late"]) == (0, 0)


def test_the_response_echoes_the_context_for_the_scheduler(fake_remote):
    sent = request()
    response = run(sent, remote=inventory(fake_remote), now=utcnow)
    assert response.context == sent.context and response.step == "reserve" and response.kind is Kind.ACTION


def with_breaker(fake_remote, *, call_timeout: float) -> RemoteClient:
    """An inventory client whose breaker opens once two distinct requests are failing."""
    options = BreakerOptions(failure_ratio=1.0, minimum_throughput=2, sampling_seconds=30, open_seconds=30, jitter=0.0)
    return RemoteClient(
        fake_remote.base_url("inventory"), call_timeout=call_timeout, breaker=CircuitBreaker("inventory", options),
    )


def test_an_open_breaker_postpones_a_step_that_could_not_call_but_fails_one_whose_own_call_failed(fake_remote):
    fake_remote.set_faults(script={f"o-{i}": ["always:transient"] for i in range(1, 4)})
    remote = with_breaker(fake_remote, call_timeout=5.0)
    retrying = AgentPolicy(max_calls=4, backoff_initial=0.01, backoff_max=0.02)

    async def three_requests():
        first = await agent.run(request("o-1", policy=retrying), remote=remote, now=utcnow)
        calls = fake_remote.effects()["calls"]
        second = await agent.run(request("o-2", policy=retrying), remote=remote, now=utcnow)
        third = await agent.run(request("o-3"), remote=remote, now=utcnow)
        await remote.close()
        return first, calls, second, third

    first, calls, second, third = asyncio.run(three_requests())
    # One request alone does not open it, however often it retries: the first used all
    # its calls (its attempt ran out: no response, the supervisor counts it)...
    assert first is None and calls == 4
    # ...the second request's first failure made two failing requests: it opened, and
    # refused that request's retry. Its own call failed, so the attempt is judged by
    # its own policy: no response (counted at complete-by), not postponed...
    assert second is None and fake_remote.effects()["calls"] == 5
    # ...while the next step for that service, which could not call at all, is postponed.
    assert third.outcome is Outcome.POSTPONED and 29 <= third.retry_after_seconds <= 30
    assert fake_remote.effects()["calls"] == 5


def test_a_lookup_refused_after_the_attempts_own_call_timed_out_ends_the_attempt_unanswered(fake_remote):
    # o-1 fails at once; o-2's call is applied but answered after the call's timeout.
    fake_remote.set_faults(script={"o-1": ["always:transient"], "o-2": ["slow"]}, slow_seconds=2)
    remote = with_breaker(fake_remote, call_timeout=0.5)
    once = AgentPolicy(max_calls=1, backoff_initial=0.01, backoff_max=0.02)

    async def two_requests():
        first = await agent.run(request("o-1", policy=once), remote=remote, now=utcnow)
        second = await agent.run(request("o-2"), remote=remote, now=utcnow)
        await remote.close()
        return first, second

    first, second = asyncio.run(two_requests())
    # o-2's timeout made two failing requests: the breaker opened and refused the lookup
    # o-2 wanted before its retry. Its own call failed, so it is not postponed: the
    # attempt ends unanswered and the supervisor counts it (the next attempt asks first).
    assert first is None and second is None
    inventory = fake_remote.effects()["services"]["inventory"]
    assert (inventory["calls"], inventory["lookups"]) == (2, 0)


def test_an_unknown_outcome_is_settled_by_lookup_without_a_second_post(fake_remote):
    done = run(request(), remote=inventory(fake_remote))
    calls = fake_remote.effects()["calls"]
    settled = run(request(attempt=2).model_copy(update={"settle_first": True}), remote=inventory(fake_remote))
    assert settled.outcome is Outcome.SUCCEEDED and settled.result == done.result
    effects = fake_remote.effects()
    assert effects["calls"] == calls and effects["services"]["inventory"]["lookups"] == 1
    # Not applied yet: the lookup answers 404 and the agent sends the action.
    fresh = run(request("o-2").model_copy(update={"settle_first": True}), remote=inventory(fake_remote))
    assert fresh.outcome is Outcome.SUCCEEDED and fake_remote.effects()["by_order"]["o-2"] == 1


def test_a_call_that_timed_out_is_settled_by_lookup_before_the_agent_sends_it_again(fake_remote):
    # Applied, but answered after the call's timeout: the outcome is unknown to the agent.
    fake_remote.set_faults(script={"o-1": ["slow"], "o-2": ["slow"]}, slow_seconds=2)
    settled = run(request("o-1"), remote=RemoteClient(fake_remote.base_url("inventory"), call_timeout=0.5))
    inventory_effects = fake_remote.effects()["services"]["inventory"]
    assert settled.outcome is Outcome.SUCCEEDED and settled.result["confirmation"]
    assert (inventory_effects["calls"], inventory_effects["lookups"], inventory_effects["replays"]) == (1, 1, 0)
    # Where the step declares no lookup, the agent sends it again with the same key:
    # the service replays its first answer.
    resent = run(request("o-2").model_copy(update={"lookup": False}),
                 remote=RemoteClient(fake_remote.base_url("inventory"), call_timeout=0.5))
    inventory_effects = fake_remote.effects()["services"]["inventory"]
    assert resent.outcome is Outcome.SUCCEEDED
    assert (inventory_effects["calls"], inventory_effects["lookups"], inventory_effects["replays"]) == (3, 1, 1)


def test_the_bulkhead_keeps_calls_to_one_service_within_its_limit(fake_remote):
    fake_remote.set_faults(script={f"o-{i}": ["slow"] for i in range(4)}, slow_seconds=0.3)
    remote = RemoteClient(fake_remote.base_url("inventory"), call_timeout=5.0, max_concurrent_calls=2)
    peak = 0

    async def watch(done: asyncio.Event):
        nonlocal peak
        while not done.is_set():
            peak = max(peak, fake_remote.effects()["in_flight"])
            await asyncio.sleep(0.01)

    async def four_at_once():
        done = asyncio.Event()
        watcher = asyncio.create_task(watch(done))
        results = await asyncio.gather(*(agent.run(request(f"o-{i}"), remote=remote, now=utcnow) for i in range(4)))
        done.set()
        await watcher
        await remote.close()
        return results

    results = asyncio.run(four_at_once())
    assert all(r.outcome is Outcome.SUCCEEDED for r in results)
    assert peak == 2
