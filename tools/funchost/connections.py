"""Clients for a binding's ``connection`` app setting, looked up as the Functions host does.

A binding names an app setting (``connection="ServiceBusConnection"``). The host reads
``<name>``, then ``AzureWebJobs<name>``; locally that is a connection string
(``UseDevelopmentStorage=true``, Azurite's, or the Service Bus emulator's). The
identity-based form of Azure (``<name>__fullyQualifiedNamespace``,
``<name>__queueServiceUri`` / ``<name>__accountName``, optional ``<name>__clientId``)
uses ``DefaultAzureCredential``; it is not exercised by the local tests.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Mapping

import requests
from azure.core.pipeline.transport import RequestsTransport
from azure.servicebus import ServiceBusClient
from azure.storage.queue import ExponentialRetry, QueueClient, QueueServiceClient
from urllib3.util.retry import Retry

from .config import ConfigError


def _lookup(setting: str, environ: Mapping[str, str]) -> str | None:
    for name in (setting, f"AzureWebJobs{setting}"):
        value = environ.get(name)
        if value:
            return value
    return None


#: HTTP connections kept per storage endpoint: every pool thread of every listener and
#: every output send shares one client, more than requests' default pool of 10.
HTTP_POOL_SIZE = 64


def _transport() -> RequestsTransport:
    """A requests transport with a bigger connection pool and no retries under the SDK's.

    An app may well set up the same for its own clients: this host imports nothing from
    the app it runs, so it keeps its own copy on purpose.
    """
    session = requests.Session()
    # The SDK retries by policy; the adapter must not retry underneath it (as azure-core sets it up).
    adapter = requests.adapters.HTTPAdapter(
        pool_maxsize=HTTP_POOL_SIZE, max_retries=Retry(total=False, redirect=False, raise_on_redirect=False)
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return RequestsTransport(session=session, session_owner=True)


class HostStorageRetry(ExponentialRetry):
    """The storage retries of the Functions host, whose queue trigger and output bindings use the
    .NET storage SDK over Azure.Core: 3 retries, exponential from 0.8 s (0.8, 1.6, 3.2 s, each
    within ±20 %), at most a minute apart ("By default, clients are setup to retry 3 times using
    an exponential retry strategy with an initial delay of 0.8 sec, and a max delay of 1 minute":
    https://github.com/Azure/azure-sdk-for-net/blob/main/sdk/core/Azure.Core/samples/Configuration.md,
    and the 0.8 s default of https://learn.microsoft.com/azure/storage/blobs/storage-retry-policy,
    both read 2026-11-25). The Python storage SDK's default (``ExponentialRetry()``) waits
    15 s + 3^n instead (18, 24 then 42 s, ±3 s): behind a 503 or a dropped connection it held a
    poll, a delete or a queue's creation at start-up for 18 s or more, which this host's Azure
    counterpart does not.
    """

    #: Azure.Core's RetryOptions defaults.
    DELAY_SECONDS = 0.8
    MAX_DELAY_SECONDS = 60.0
    MAX_RETRIES = 3
    #: Azure.Core's DelayStrategy spreads each delay over ±20 %.
    JITTER = 0.2

    def __init__(self) -> None:
        super().__init__(retry_total=self.MAX_RETRIES)

    def get_backoff_time(self, settings) -> float:
        """Before retry number ``settings["count"]`` (1 for the first retry)."""
        delay = min(self.MAX_DELAY_SECONDS, self.DELAY_SECONDS * 2 ** (max(1, settings["count"]) - 1))
        return delay * random.uniform(1 - self.JITTER, 1 + self.JITTER)


def _credential(setting: str, environ: Mapping[str, str]):
    from azure.identity import DefaultAzureCredential

    client_id = environ.get(f"{setting}__clientId")
    return DefaultAzureCredential(managed_identity_client_id=client_id) if client_id else DefaultAzureCredential()


class Clients:
    """Caches one service client per connection setting; thread-safe."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        self._lock = threading.Lock()
        self._storage: dict[str, QueueServiceClient] = {}
        self._servicebus: dict[str, ServiceBusClient] = {}

    def storage(self, setting: str) -> QueueServiceClient:
        with self._lock:
            if setting not in self._storage:
                self._storage[setting] = self._new_storage(setting)
            return self._storage[setting]

    def queue(self, setting: str, queue_name: str) -> QueueClient:
        """A client for one storage queue. Messages are sent and read as raw text: the host encodes."""
        return self.storage(setting).get_queue_client(queue_name)

    def servicebus_client(self, setting: str) -> ServiceBusClient:
        """A shared ServiceBusClient (senders and receivers open their own links)."""
        with self._lock:
            if setting not in self._servicebus:
                self._servicebus[setting] = self.new_servicebus(setting)
            return self._servicebus[setting]

    def new_servicebus(self, setting: str) -> ServiceBusClient:
        """A new ServiceBusClient: a listener owns its own, so its connection is its own."""
        value = _lookup(setting, self._environ)
        if value:
            return ServiceBusClient.from_connection_string(value)
        namespace = self._environ.get(f"{setting}__fullyQualifiedNamespace")
        if namespace:
            return ServiceBusClient(namespace, _credential(setting, self._environ))
        raise ConfigError(
            f"Service Bus connection setting {setting!r} is not set (nor {setting}__fullyQualifiedNamespace)"
        )

    def _new_storage(self, setting: str) -> QueueServiceClient:
        value = _lookup(setting, self._environ)
        if value:
            return QueueServiceClient.from_connection_string(
                value, transport=_transport(), retry_policy=HostStorageRetry()
            )
        uri = self._environ.get(f"{setting}__queueServiceUri")
        account = self._environ.get(f"{setting}__accountName")
        if uri or account:
            return QueueServiceClient(
                uri or f"https://{account}.queue.core.windows.net",
                credential=_credential(setting, self._environ),
                transport=_transport(),
                retry_policy=HostStorageRetry(),
            )
        raise ConfigError(
            f"storage connection setting {setting!r} is not set (nor {setting}__queueServiceUri / __accountName)"
        )

    def close(self) -> None:
        with self._lock:
            for client in self._servicebus.values():
                try:
                    client.close()
                except Exception:  # closing during shutdown: nothing left to do about it
                    pass
            for client in self._storage.values():
                client.close()
            self._servicebus.clear()
            self._storage.clear()
