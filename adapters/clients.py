"""Azure SDK clients built from Settings: a connection string locally, managed identity in Azure.

Clients are created once per process and reused (the SDKs pool connections).
"""

from __future__ import annotations

from azure.core.pipeline.transport import RequestsTransport

from adapters.settings import Settings, state_account_kind
from adapters.transport import shared_session

#: Azurite's development account: the fixed name and key that every storage emulator
#: accepts, published in Microsoft's Azurite docs. Not a secret; it opens nothing in Azure.
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def development_storage(
    blob: int = 10000, queue: int = 10001, table: int = 10002, *, account: str = DEV_ACCOUNT
) -> str:
    """The connection string of an account (the development account by default) of an
    Azurite on 127.0.0.1 with these ports. Every account of the local stack has the
    development account's well-known key (devtools/azurite.py)."""
    host = "http://127.0.0.1"
    return (
        f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={DEV_KEY};"
        f"BlobEndpoint={host}:{blob}/{account};"
        f"QueueEndpoint={host}:{queue}/{account};"
        f"TableEndpoint={host}:{table}/{account};"
    )


#: What ``UseDevelopmentStorage=true`` means: Azurite on its well-known ports.
DEVELOPMENT_STORAGE = development_storage()


def storage_connection_string(value: str) -> str:
    """Expand the ``UseDevelopmentStorage=true`` shorthand the Functions host understands."""
    return DEVELOPMENT_STORAGE if value.strip().rstrip(";").lower() == "usedevelopmentstorage=true" else value


#: How long a storage request may take to connect, and wait for the next bytes of its
#: answer (seconds; a socket timeout, not the whole answer's). azure-core's defaults are 300 s
#: each: a storage account that accepts a connection and never answers (a firewall, a
#: private endpoint reached from outside) held a function, or ordersctl, for minutes a try.
#: A Table or Queue operation answers within 30 s on Azure's side (its largest server
#: timeout: "Setting timeouts for Table service operations", "... for Queue service
#: operations", learn.microsoft.com/rest/api/storageservices), so 60 s cuts no answer short,
#: and a blob read that streams is not cut either; the SDK's retries then try again.
CONNECT_TIMEOUT_SECONDS = 20
READ_TIMEOUT_SECONDS = 60


def transport() -> RequestsTransport:
    """The HTTP transport of a storage client: over this process's one shared session
    (adapters/transport.py: one pool per endpoint, lean per-request path), which the
    client does not own (closing a client leaves the others' connections open); at most
    :data:`CONNECT_TIMEOUT_SECONDS` to connect and :data:`READ_TIMEOUT_SECONDS` to answer."""
    return RequestsTransport(
        session=shared_session(), session_owner=False, use_env_settings=False,
        connection_timeout=CONNECT_TIMEOUT_SECONDS, read_timeout=READ_TIMEOUT_SECONDS,
    )


def credential(client_id: str | None, *, aio: bool = False):
    """Managed identity when a client id is configured (user-assigned), else the default
    chain; ``aio`` for the async clients (azure.identity.aio, over aiohttp)."""
    import importlib

    identity = importlib.import_module("azure.identity.aio" if aio else "azure.identity")
    if client_id:
        return identity.ManagedIdentityCredential(client_id=client_id)
    return identity.DefaultAzureCredential()


def table_service(settings: Settings):
    """The app's tables: in the order state's own account when ``StateStorage`` names one
    (docs/scale.md), else in the host's ``AzureWebJobsStorage`` account."""
    if settings.state_storage_connection_string or settings.state_storage_account_name or settings.state_storage_table_service_uri:
        connection, account, uri, client_id = (
            settings.state_storage_connection_string, settings.state_storage_account_name,
            settings.state_storage_table_service_uri, settings.state_storage_client_id,
        )
    else:
        connection, account, uri, client_id = (
            settings.storage_connection_string, settings.storage_account_name,
            settings.storage_table_service_uri, settings.storage_client_id,
        )
    return _table_service(connection, uri or (account and _table_endpoint(account)), client_id)


def state_table_services(settings: Settings) -> list:
    """One table service per account of the order state, in ``STATE_STORAGE_ACCOUNTS``'
    order (adapters/accounts.py); without that setting, :func:`table_service`'s one. In
    Azure the accounts are reached with the identity ``StateStorage__clientId`` names
    (else ``AzureWebJobsStorage__clientId``'s)."""
    accounts = settings.state_accounts()
    if not accounts:
        return [table_service(settings)]
    client_id = settings.state_storage_client_id or settings.storage_client_id
    services = []
    for item in accounts:
        kind = state_account_kind(item)
        if kind == "connection":
            services.append(_table_service(item, None, None))
        else:
            services.append(_table_service(None, item if kind == "uri" else _table_endpoint(item), client_id))
    return services


def _table_endpoint(account: str) -> str:
    return f"https://{account}.table.core.windows.net"


def _table_service(connection: str | None, endpoint: str | None, client_id: str | None):
    # Its table clients write and read transactions without the email package (adapters/batch.py).
    from adapters.batch import LeanTableServiceClient

    if connection:
        return LeanTableServiceClient.from_connection_string(
            storage_connection_string(connection), transport=transport()
        )
    return LeanTableServiceClient(endpoint, credential=credential(client_id), transport=transport())


def archive_container(settings: Settings):
    """The archive's blob container (docs/retention.md): in ``ArchiveStorage``'s account
    when set (a connection string locally, ``ArchiveStorage__blobServiceUri`` with the identity
    ``ArchiveStorage__clientId`` names in Azure), else in the host's ``AzureWebJobsStorage``
    account (its connection string, or ``__blobServiceUri`` / ``__accountName``)."""
    from azure.storage.blob import ContainerClient

    from adapters.archive import READ_CHUNK

    container = settings.archive_container
    if settings.archive_storage_connection_string or settings.archive_storage_blob_service_uri:
        connection, uri = settings.archive_storage_connection_string, settings.archive_storage_blob_service_uri
        client_id = settings.archive_storage_client_id or settings.storage_client_id
    else:
        connection, uri = settings.storage_connection_string, settings.storage_blob_service_uri
        client_id = settings.storage_client_id
        if not connection and not uri:
            uri = f"https://{settings.storage_account_name}.blob.core.windows.net"
    # A day is read back in chunks of READ_CHUNK, its first request too (the SDK's first GET
    # would take up to 32 MiB at once): an operator's read holds a few MiB, whatever the day's size.
    chunks = {"max_single_get_size": READ_CHUNK, "max_chunk_get_size": READ_CHUNK}
    if connection:
        return ContainerClient.from_connection_string(
            storage_connection_string(connection), container, transport=transport(), **chunks
        )
    return ContainerClient(uri, container, credential=credential(client_id), transport=transport(), **chunks)


#: The nudge queue's retries of a 5xx or a dropped connection (docs/scale.md): the storage
#: SDK's default waits 15 s + 3^n (with 3 s jitter) before each retry, and a nudge that
#: waits that long holds its order for as long; these wait ~0.2 s + 1.5^n (1.7, 2.5, 3.6 s;
#: a fourth, 5.3 s, only when the faults are of two kinds: the SDK retries each kind at most
#: 3 times). A retried send that had been applied leaves a second nudge: harmless, the
#: claim is If-Match.
QUEUE_RETRY = {"initial_backoff": 0.2, "increment_base": 1.5, "retry_total": 4, "random_jitter_range": 0.2}


def queue_client(settings: Settings, queue_name: str):
    """A storage-queue client that writes base64 bodies, as the Functions host reads them."""
    from azure.storage.queue import BinaryBase64DecodePolicy, ExponentialRetry, QueueClient, TextBase64EncodePolicy

    options = dict(
        message_encode_policy=TextBase64EncodePolicy(),
        message_decode_policy=BinaryBase64DecodePolicy(),
        transport=transport(),
        retry_policy=ExponentialRetry(**QUEUE_RETRY),
    )
    if settings.storage_connection_string:
        return QueueClient.from_connection_string(
            storage_connection_string(settings.storage_connection_string), queue_name, **options
        )
    endpoint = settings.storage_queue_service_uri or f"https://{settings.storage_account_name}.queue.core.windows.net"
    return QueueClient(endpoint, queue_name, credential=credential(settings.storage_client_id), **options)


#: The Service Bus SDK's retries of an operation Azure refused for now: throttled
#: (``ServiceBusServerBusyError``: Standard's credits come back every second and Azure asks
#: to "wait 2 seconds"), a link or connection dropped (``ServiceBusConnectionError``; the
#: SDK opens a new one). It waits 1, 2 then 4 s (factor x 2^n, exponential) and then raises:
#: the invocation fails, its trigger is retried, and a row the scheduler wrote before the send
#: is recovered by the supervisor (docs/scale.md, "Service Bus throttling, lost locks, dropped
#: links"). The SDK's default (0.8 s factor, 3 retries) waits 11 s in all.
SERVICEBUS_RETRY = {"retry_total": 3, "retry_backoff_factor": 0.5, "retry_backoff_max": 4, "retry_mode": "exponential"}


def servicebus_retry_seconds() -> float:
    """How long :data:`SERVICEBUS_RETRY` waits in all before a send gives up (1 + 2 + 4 s):
    how late after its deadline an agent's answer may still be sent (core.lifecycle's send slack)."""
    r = SERVICEBUS_RETRY
    return sum(min(r["retry_backoff_max"], r["retry_backoff_factor"] * 2 ** n) for n in range(1, r["retry_total"] + 1))


def async_servicebus_client(settings: Settings):
    """A Service Bus client for ``async`` functions (created on the running event loop)."""
    from azure.servicebus.aio import ServiceBusClient

    if settings.servicebus_connection_string:
        return ServiceBusClient.from_connection_string(settings.servicebus_connection_string, **SERVICEBUS_RETRY)
    return ServiceBusClient(
        settings.servicebus_namespace, credential(settings.servicebus_client_id, aio=True), **SERVICEBUS_RETRY
    )


def servicebus_client(settings: Settings):
    from azure.servicebus import ServiceBusClient

    if settings.servicebus_connection_string:
        return ServiceBusClient.from_connection_string(settings.servicebus_connection_string, **SERVICEBUS_RETRY)
    return ServiceBusClient(settings.servicebus_namespace, credential(settings.servicebus_client_id), **SERVICEBUS_RETRY)



def logs_query_client(client_id: str | None):
    """A Log Analytics query client (the operator page's spans in Azure, adapters/traces.py),
    with the app's managed identity, which holds Log Analytics Reader on the workspace."""
    from azure.monitor.query import LogsQueryClient

    return LogsQueryClient(credential(client_id))
