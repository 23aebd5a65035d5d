"""The host's storage clients retry as the Functions host's .NET storage client does."""

from __future__ import annotations

from tools.funchost.connections import Clients, HostStorageRetry

from .azurite import ACCOUNT, KEY

#: Azurite's development account on its default queue port (never contacted here).
DEV = f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};QueueEndpoint=http://127.0.0.1:10001/{ACCOUNT};"


def test_retries_wait_as_azure_cores_defaults_three_times_from_0_8_s():
    policy = HostStorageRetry()
    for count, base in ((1, 0.8), (2, 1.6), (3, 3.2)):
        waits = [policy.get_backoff_time({"count": count}) for _ in range(200)]
        assert all(base * 0.8 <= wait <= base * 1.2 for wait in waits), (count, min(waits), max(waits))
    assert policy.get_backoff_time({"count": 30}) <= 60 * 1.2  # at most a minute (with jitter)
    assert policy.total_retries == 3


def test_every_queue_client_of_a_connection_carries_the_hosts_retry_policy():
    clients = Clients({"Storage": DEV})
    try:
        policies = clients.queue("Storage", "work-items")._pipeline._impl_policies
        assert sum(isinstance(policy, HostStorageRetry) for policy in policies) == 1
    finally:
        clients.close()
