"""The agents' wait between the calls of one attempt (agents.remote.backoff): the step's
policy as data, as tenacity's ``wait_exponential_jitter`` computed it before."""

from __future__ import annotations

from agents.remote import TransientRemoteError, backoff
from core.models import AgentPolicy

POLICY = AgentPolicy(max_calls=30, backoff_initial=0.2, backoff_max=5.0)


def test_exponential_from_the_initial_wait_with_up_to_one_more_of_jitter_capped_at_the_maximum():
    failed = TransientRemoteError("HTTP 503")
    for calls, low in ((1, 0.2), (2, 0.4), (3, 0.8), (4, 1.6), (5, 3.2)):
        waits = [backoff(POLICY, calls, failed) for _ in range(200)]
        assert all(low <= wait <= min(low + 0.2, 5.0) for wait in waits), calls
        assert max(waits) - min(waits) > 0.1, "jittered"
    assert {backoff(POLICY, calls, failed) for calls in (6, 20, 2000)} == {5.0}


def test_the_services_retry_after_is_waited_for_at_least_the_initial_wait():
    assert backoff(POLICY, 1, TransientRemoteError("HTTP 429", retry_after=3.0)) == 3.0
    assert backoff(POLICY, 3, TransientRemoteError("HTTP 429", retry_after=0.0)) == 0.2
    assert backoff(POLICY, 2, TransientRemoteError("HTTP 503", retry_after=60.0)) == 60.0
