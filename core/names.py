"""Every queue, table and app-setting name, defined once.

The functions (bindings in ``function_app.py``), the local stack (Service Bus
emulator, local host) and the Bicep consistency tests all read these values, so a
renamed queue cannot drift between code, tests and infrastructure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta

from core.workflow import remotes

# --- App settings (environment variables / Function app settings) -------------

#: Storage connection used by the Functions host and by this app (tables, queues).
#: Locally a connection string; in Azure the identity-based ``__accountName`` form.
STORAGE_CONNECTION = "AzureWebJobsStorage"
#: Optional: a storage account of its own for the order state (the app's tables), apart
#: from the Functions host's. Unset, the tables live in ``AzureWebJobsStorage``'s account.
#: Locally a connection string; in Azure ``StateStorage__tableServiceUri`` (identity-based).
#: The scheduler's storage queues stay with the host's account (docs/scale.md says why).
STATE_STORAGE_CONNECTION = "StateStorage"
#: Optional: the order state spread over several storage accounts, a comma-separated list
#: (adapters/accounts.py): in Azure account names or table service URIs (identity-based, with
#: ``StateStorage__clientId``), locally connection strings. Each order lives in the account
#: :func:`state_account` picks; the list is fixed for the deployment's life (docs/scale.md).
STATE_STORAGE_ACCOUNTS_SETTING = "STATE_STORAGE_ACCOUNTS"
#: At most this many state accounts (a subscription holds 250 accounts per region by default).
MAX_STATE_STORAGE_ACCOUNTS = 64
#: Service Bus connection. Locally a connection string; in Azure the identity-based
#: ``ServiceBusConnection__fullyQualifiedNamespace`` form.
SERVICEBUS_CONNECTION = "ServiceBusConnection"

#: App settings that hold queue/table names. Bindings refer to them as ``%NAME%``
#: so a deployment can rename a queue without a code change.
ORDERS_QUEUE_SETTING = "ORDERS_QUEUE"
ORDER_EVENTS_QUEUE_SETTING = "ORDER_EVENTS_QUEUE"
CANCELLATIONS_QUEUE_SETTING = "CANCELLATIONS_QUEUE"
AGENT_RESPONSES_QUEUE_SETTING = "AGENT_RESPONSES_QUEUE"
ALERTS_QUEUE_SETTING = "ALERTS_QUEUE"
#: The scheduler's single queue of before the sharding, still read (drained) by ``schedule_order``.
SCHEDULER_QUEUE_SETTING = "SCHEDULER_QUEUE"
ORDERS_TABLE_SETTING = "ORDERS_TABLE"
REJECTIONS_TABLE_SETTING = "REJECTIONS_TABLE"
SUPERVISOR_SCHEDULE_SETTING = "SUPERVISOR_SCHEDULE"
#: Who may call the status API (core/access.py): ``easyauth`` (app roles from App Service
#: Authentication), ``none`` (no check: the local stack, on loopback), ``disabled``
#: (every call refused; the default).
API_AUTH_SETTING = "API_AUTH"

#: How many partitions the active index is spread over (docs/scale.md, "The active index, sharded").
ACTIVE_INDEX_SHARDS_SETTING = "ACTIVE_INDEX_SHARDS"

#: A waiting step's deadline (an approval: core.workflow.APPROVAL_WORKFLOW), in seconds, when
#: its workflow fixes none: the Complete-By recorded when the line starts waiting is the claim
#: time plus this (docs/workflows.md, "Waiting steps"). A day by default, a year at most.
APPROVAL_TIMEOUT_SETTING = "APPROVAL_TIMEOUT_SECONDS"
DEFAULT_APPROVAL_TIMEOUT_SECONDS = 24 * 60 * 60
MAX_APPROVAL_TIMEOUT_SECONDS = 365 * 24 * 60 * 60

#: Retention (adapters/retention.py, docs/retention.md): finished orders older than
#: RETENTION_DAYS are archived to blob storage, then deleted, by the retention timer.
RETENTION_DAYS_SETTING = "RETENTION_DAYS"
#: "true": Error orders are archived and deleted too (default: they stay for an operator).
RETENTION_INCLUDE_ERROR_SETTING = "RETENTION_INCLUDE_ERROR"
#: The most orders one retention tick archives and deletes (its work is bounded).
RETENTION_MAX_ORDERS_SETTING = "RETENTION_MAX_ORDERS_PER_TICK"
RETENTION_SCHEDULE_SETTING = "RETENTION_SCHEDULE"
#: The blob container of the archive, in ``ArchiveStorage``'s account (else the host's).
ARCHIVE_CONTAINER_SETTING = "ARCHIVE_CONTAINER"
#: Local tests only (the Bicep never sets it): ``exit-after-archive`` ends the process right
#: after a retention tick's archive step, before it deletes anything, as a crash there would.
RETENTION_FAULT_SETTING = "RETENTION_FAULT"
RETENTION_FAULT_EXIT = "exit-after-archive"
#: Optional: the archive's own storage account. Locally a connection string; in Azure
#: ``ArchiveStorage__blobServiceUri`` (identity-based). Unset: ``AzureWebJobsStorage``'s account.
ARCHIVE_STORAGE_CONNECTION = "ArchiveStorage"

# --- Default names ----------------------------------------------------------------

ORDERS_QUEUE = "orders"
#: External events for waiting steps (an approval), from any client (docs/clients.md, "Sending order events").
ORDER_EVENTS_QUEUE = "order-events"
#: Cancel requests from any client (docs/clients.md, "Cancelling an order"): body core.models.CancelRequest.
CANCELLATIONS_QUEUE = "order-cancellations"
AGENT_RESPONSES_QUEUE = "agent-responses"
ALERTS_QUEUE = "alerts"
SCHEDULER_QUEUE = "scheduler"
ORDERS_TABLE = "orders"
REJECTIONS_TABLE = "rejections"

#: The Python worker's pool for sync functions, set explicitly (infra/resources.bicep
#: says why); the local stack and local.settings.template.json use the same value.
WORKER_THREADS_SETTING = "PYTHON_THREADPOOL_THREAD_COUNT"
WORKER_THREADS = 16

#: NCRONTAB with seconds (six fields, seconds first): every 15 seconds.
DEFAULT_SUPERVISOR_SCHEDULE = "*/15 * * * * *"
#: The retention timer: every minute, each tick archiving at most RETENTION_MAX_ORDERS_PER_TICK
#: (5,000 a minute: 7.2 million orders a day, ~83 orders/s sustained; docs/scale.md sizes it).
DEFAULT_RETENTION_SCHEDULE = "0 * * * * *"
DEFAULT_RETENTION_DAYS = 30
DEFAULT_RETENTION_MAX_ORDERS = 5000
ARCHIVE_CONTAINER = "archive"

# --- The active index: one row per in-flight order, spread over shards ----------------
# adapters/store.py writes an order's index row in the shard a stable hash of its id picks;
# the supervisor's sweep and the in-flight lists read every shard (docs/scale.md).

#: Every index partition's key starts with this (``_active-000``, ``_active-001``, ...).
#: Order ids start with a letter or digit, so no order's partition can start with ``_``.
ACTIVE_PREFIX = "_active"
#: 16 partitions of ~2,000 entities/s each: an index write and delete per order leave room
#: for ~16,000 orders/s before the index, not the rest, is the limit (docs/scale.md).
DEFAULT_ACTIVE_INDEX_SHARDS = 16
#: Three decimal digits in the partition key; far more than 10,000 orders/s needs.
MAX_ACTIVE_INDEX_SHARDS = 256


#: Which 8-byte slice of the order id's SHA-256 each spread reads: independent slices, so
#: the index shards spread evenly within each state account, and the queues over both.
#: The fourth picks an order's stamp (:func:`stamp_of`), so each stamp's orders spread
#: evenly over its accounts, shards and queues too.
_INDEX_SLICE, _ACCOUNT_SLICE, _QUEUE_SLICE, _STAMP_SLICE = 0, 1, 2, 3


def order_slot(order_id: str, count: int, *, slice_: int) -> int:
    """A stable spread of order ids over ``count`` places: 8 bytes (slice ``slice_``) of the
    SHA-256 of the id, modulo ``count``. Stable across processes and versions (never
    Python's ``hash()``, which is salted per process)."""
    digest = hashlib.sha256(order_id.encode()).digest()
    return int.from_bytes(digest[8 * slice_ : 8 * slice_ + 8], "big") % count


def active_shard(order_id: str, shards: int) -> int:
    """The shard of an order's index row: the first 8 bytes of the SHA-256 of its id,
    modulo the shard count."""
    if not 1 <= shards <= MAX_ACTIVE_INDEX_SHARDS:
        raise ValueError(f"the active index has 1 to {MAX_ACTIVE_INDEX_SHARDS} shards, not {shards}")
    return order_slot(order_id, shards, slice_=_INDEX_SLICE)


def state_account(order_id: str, accounts: int) -> int:
    """The storage account (its place in ``STATE_STORAGE_ACCOUNTS``) an order lives in."""
    if not 1 <= accounts <= MAX_STATE_STORAGE_ACCOUNTS:
        raise ValueError(f"the order state has 1 to {MAX_STATE_STORAGE_ACCOUNTS} accounts, not {accounts}")
    return order_slot(order_id, accounts, slice_=_ACCOUNT_SLICE)


# --- Stamps: whole deployments, each order sent to the one its id picks ------------------
# Past one deployment's ceiling the same app is deployed S times (infra/main.bicep
# ``stamps``), and every client sends an order to the stamp its id picks (docs/scale.md,
# "Past one deployment: stamps"). The deployments know nothing of each other; the rule
# below, stated in docs/clients.md for clients in any language, is the whole routing.

#: At most this many stamps (infra/main.bicep ``stamps``).
MAX_STAMPS = 16
#: For clients and operators, not the app: the stamps' Service Bus namespaces, comma-separated
#: in stamp order (from main.bicep's output AZURE_STAMPS). ``ordersctl stamp``
#: reads it, and ``ordersctl send-order`` refuses an order whose stamp is not the one its
#: settings reach.
ORDERS_STAMPS_SETTING = "ORDERS_STAMPS"
#: The routing rule in words, as docs/clients.md and docs/deploy.md state it for clients.
STAMP_RULE = (
    "the last 8 bytes of the SHA-256 of the order id (UTF-8), read as a big-endian"
    " unsigned integer, modulo the number of stamps"
)


def stamp_of(order_id: str, stamps: int) -> int:
    """The stamp (0 to ``stamps`` - 1, its place in the deployment's stamp list) an order
    is sent to: :data:`STAMP_RULE`. A slice of the hash apart from the index shard's, the
    account's and the queue's, so within one stamp those still spread evenly."""
    if not 1 <= stamps <= MAX_STAMPS:
        raise ValueError(f"a deployment has 1 to {MAX_STAMPS} stamps, not {stamps}")
    return order_slot(order_id, stamps, slice_=_STAMP_SLICE)


# --- The scheduler's storage queues: one per shard, an order's nudges all in one ---------
# A storage queue takes ~2,000 messages/s (docs/scale.md); the nudges of order X always go
# to scheduler_queue(scheduler_queue_shard(X)), each queue read by a function of its own
# (scheduler/blueprint.py). A constant, not a setting: functions are declared at import.

#: 8 queues x 2,000 messages/s: ~12,800 orders/s at 80% (an order enqueues ~1 nudge), above
#: what one deployment's other limits allow (docs/scale.md, "The scheduler's queues, sharded").
SCHEDULER_QUEUE_SHARDS = 8


def scheduler_queue_shard(order_id: str) -> int:
    """The scheduler queue an order's nudges go to."""
    return order_slot(order_id, SCHEDULER_QUEUE_SHARDS, slice_=_QUEUE_SLICE)


def scheduler_queue(shard: int) -> str:
    """One of the scheduler's queues, e.g. ``scheduler-3``."""
    return f"{SCHEDULER_QUEUE}-{shard}"


def scheduler_queue_setting(shard: int) -> str:
    """The app setting that names that queue, e.g. ``SCHEDULER_QUEUE_3``."""
    return f"{SCHEDULER_QUEUE_SETTING}_{shard}"


#: The scheduler function on the single queue of before the sharding (it drains it).
SCHEDULE_FUNCTION = "schedule_order"


def schedule_function(shard: int) -> str:
    """The scheduler function on that queue, e.g. ``schedule_order_3``."""
    return f"{SCHEDULE_FUNCTION}_{shard}"


def schedule_functions() -> tuple[str, ...]:
    """Every function that claims lines from a scheduler queue: each shard's, and the drain's.
    Disabling them all (``AzureWebJobs.<name>.Disabled``) holds every claim back."""
    return (*(schedule_function(shard) for shard in range(SCHEDULER_QUEUE_SHARDS)), SCHEDULE_FUNCTION)


def active_partition(shard: int) -> str:
    """The PartitionKey of one shard of the active index, e.g. ``_active-007``."""
    return f"{ACTIVE_PREFIX}-{shard:03d}"


# --- The search indexes (core/search.py, adapters/search.py; docs/search.md) ---

#: A customer's orders, newest first: ``_customer-<customer id>``.
CUSTOMER_PREFIX = "_customer"
#: The Error orders of one cause: ``_error-<group>``; the groups themselves in ``_error-groups``.
ERROR_PREFIX = "_error"
ERROR_GROUPS_PARTITION = f"{ERROR_PREFIX}-groups"
#: ``POST /api/errors/{group}/resubmit``: orders resubmitted per second at most, and per request.
BULK_RESUBMIT_RATE_SETTING = "BULK_RESUBMIT_PER_SECOND"
BULK_RESUBMIT_BATCH_SETTING = "BULK_RESUBMIT_BATCH"
# --- The finished index: one row per finished order, by the UTC day it ended and shard ----
# adapters/finished.py writes it when an order ends, before the order leaves the active
# index; the retention timer walks the days that are due (core/retention.py).

#: ``_finished-2026-11-25-007``: the day the order ended, then the shard the same hash as
#: the active index picks (a single day partition would cap near 2,000 entities/s).
FINISHED_PREFIX = "_finished"


def finished_partition(day: str, shard: int) -> str:
    """The PartitionKey of one shard of one day of the finished index."""
    return f"{FINISHED_PREFIX}-{day}-{shard:03d}"


# --- Per remote service (one agent function and one request queue each) -------------
# Derived from the remote's name in core.workflow: a new remote service there gets its
# queue, app settings and agent function from these, and tests/infra checks the Bicep.


def _upper(remote: str) -> str:
    return remote.upper().replace("-", "_")


def requests_queue(remote: str) -> str:
    """The queue of requests for one remote service's agent, e.g. ``inventory-requests``."""
    return f"{remote}-requests"


def requests_queue_setting(remote: str) -> str:
    """The app setting that names that queue, e.g. ``INVENTORY_REQUESTS_QUEUE``."""
    return f"{_upper(remote)}_REQUESTS_QUEUE"


def remote_url_setting(remote: str) -> str:
    """The app setting with the remote service's base URL, e.g. ``REMOTE_INVENTORY_URL``."""
    return f"REMOTE_{_upper(remote)}_URL"


def agent_function(remote: str) -> str:
    """The agent function for one remote service, e.g. ``run_inventory_agent``."""
    return f"run_{remote}_agent"


#: Every remote service's base-URL setting (required; no default).
REMOTE_URL_SETTINGS: dict[str, str] = {remote: remote_url_setting(remote) for remote in remotes()}


@dataclass(frozen=True)
class ServiceBusQueueSpec:
    """A Service Bus queue this app uses, with the properties it relies on.

    The Bicep templates provision the same values (checked by tests/infra), and the
    local Service Bus emulator declares its queues from this list.
    """

    name: str
    setting: str
    lock_duration: timedelta = timedelta(seconds=60)
    max_delivery_count: int = 10
    default_ttl: timedelta = timedelta(days=14)
    dead_letter_on_expiry: bool = False
    duplicate_detection: bool = False
    #: How long Service Bus remembers a MessageId when duplicate detection is on.
    duplicate_detection_window: timedelta = timedelta(days=1)


SERVICEBUS_QUEUES: tuple[ServiceBusQueueSpec, ...] = (
    # Orders from any client. Dead-lettering on expiry keeps an order that nobody
    # read in time where an operator can see it; MessageId is the dedup key.
    ServiceBusQueueSpec(
        ORDERS_QUEUE,
        ORDERS_QUEUE_SETTING,
        max_delivery_count=10,
        dead_letter_on_expiry=True,
        duplicate_detection=True,
    ),
    # Events for waiting steps (approvals) from any client, as orders: MessageId is the
    # dedup key (core.models.EVENT_MESSAGE_ID_RULE); an event nobody read in time is
    # dead-lettered where an operator can see it.
    ServiceBusQueueSpec(
        ORDER_EVENTS_QUEUE,
        ORDER_EVENTS_QUEUE_SETTING,
        max_delivery_count=10,
        dead_letter_on_expiry=True,
        duplicate_detection=True,
    ),
    # Cancel requests from any client, like orders: MessageId 'cancel:<order id>' is the
    # dedup key (core.models.cancel_message_id); the app's cancel is idempotent anyway.
    ServiceBusQueueSpec(
        CANCELLATIONS_QUEUE,
        CANCELLATIONS_QUEUE_SETTING,
        max_delivery_count=10,
        dead_letter_on_expiry=True,
        duplicate_detection=True,
    ),
    # One request queue per remote service, so a slow service cannot starve the
    # others. Requests carry their own time-to-live (complete-by - now). An expired
    # request is discarded, never dead-lettered: the pattern forbids acting after
    # complete-by, and the supervisor recovers the step.
    *(
        ServiceBusQueueSpec(
            requests_queue(remote), requests_queue_setting(remote), max_delivery_count=5, dead_letter_on_expiry=False
        )
        for remote in remotes()
    ),
    ServiceBusQueueSpec(AGENT_RESPONSES_QUEUE, AGENT_RESPONSES_QUEUE_SETTING, max_delivery_count=10),
    # Operator alerts; kept for a week for whoever reads them. An alert's MessageId is
    # stable per failed attempt, so a repeat (after a crash between the Error write
    # and the send) is dropped here.
    ServiceBusQueueSpec(ALERTS_QUEUE, ALERTS_QUEUE_SETTING, default_ttl=timedelta(days=7), duplicate_detection=True),
)

#: The queues any client may send to (each with duplicate detection; a client's Data Sender
#: role is scoped to each of them alone, docs/deploy.md); every other queue is the app's own.
CLIENT_QUEUES: tuple[str, ...] = (ORDERS_QUEUE, CANCELLATIONS_QUEUE)

#: The scheduler's queues, by shard: (queue name, app setting).
SCHEDULER_QUEUES: tuple[tuple[str, str], ...] = tuple(
    (scheduler_queue(shard), scheduler_queue_setting(shard)) for shard in range(SCHEDULER_QUEUE_SHARDS)
)
#: Storage queues (the scheduler's nudges): the shards, and the single queue of before the
#: sharding (nothing is sent there any more; ``schedule_order`` drains what an upgrade left
#: in it). The Functions host moves a message that keeps failing to ``<name>-poison``.
STORAGE_QUEUES: tuple[tuple[str, str], ...] = (*SCHEDULER_QUEUES, (SCHEDULER_QUEUE, SCHEDULER_QUEUE_SETTING))
POISON_SUFFIX = "-poison"

TABLES: tuple[tuple[str, str], ...] = (
    (ORDERS_TABLE, ORDERS_TABLE_SETTING),
    (REJECTIONS_TABLE, REJECTIONS_TABLE_SETTING),
)

#: The app settings that name a queue, table or schedule, with their defaults.
NAME_SETTINGS: dict[str, str] = {
    **{q.setting: q.name for q in SERVICEBUS_QUEUES},
    **{setting: name for name, setting in STORAGE_QUEUES},
    **{setting: name for name, setting in TABLES},
    SUPERVISOR_SCHEDULE_SETTING: DEFAULT_SUPERVISOR_SCHEDULE,
    RETENTION_SCHEDULE_SETTING: DEFAULT_RETENTION_SCHEDULE,
    ARCHIVE_CONTAINER_SETTING: ARCHIVE_CONTAINER,
}

# --- Telemetry: where it goes, and the names of spans, attributes and metrics -----------
# adapters/telemetry.py records them; docs/observability.md explains each one; the
# Bicep's alert rules and workbook query the metrics by these names (tests/infra checks).

#: Azure: Application Insights (the Functions host reads the same two settings).
APPINSIGHTS_CONNECTION_SETTING = "APPLICATIONINSIGHTS_CONNECTION_STRING"
#: ``Authorization=AAD;ClientId=<identity>``: telemetry is sent with that identity's token.
APPINSIGHTS_AUTHENTICATION_SETTING = "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"
#: Locally: spans, and metric points, as JSON lines appended to these files (one per process).
SPANS_FILE_SETTING = "OTEL_SPANS_FILE"
METRICS_FILE_SETTING = "OTEL_METRICS_FILE"
#: Locally: every host's spans files, a glob pattern (``.../spans-host-*.jsonl``), which the
#: operator page reads for an order's timeline (``GET /api/orders/{id}/trace``, api/ops.py).
#: Unset: the host's own OTEL_SPANS_FILE only; neither set: no trace, the step rows only.
TRACE_SPANS_FILES_SETTING = "TRACE_SPANS_FILES"
#: Azure: the Log Analytics workspace (its workspace id, a GUID) behind the Application
#: Insights component, from which the operator page reads an order's spans (set by the Bicep).
APPINSIGHTS_WORKSPACE_SETTING = "APPLICATIONINSIGHTS_WORKSPACE_ID"
#: ``service.name`` of every span and metric (Application Insights: cloud_RoleName).
TELEMETRY_SERVICE = "scheduler-agent-supervisor"

# Spans (one trace per order; docs/observability.md draws the tree).
SPAN_SUBMIT = "order.submit"  # submit_order: the order message taken in (or rejected)
SPAN_SCHEDULE = "order.schedule"  # schedule_order: a nudge that claimed nothing
SPAN_CLAIM = "order.claim"  # a claim of a step's action, and its agent request sent
SPAN_COMPENSATE = "order.compensate"  # a claim of a step's compensation (an undo), and its request sent
SPAN_AGENT = "agent.run"  # an agent's handling of one request
SPAN_RECORD = "order.record"  # complete_step: an agent response recorded (or ignored)
SPAN_CLOSE = "order.close"  # the order's final state: status event, alert, out of the index
SPAN_RESUBMIT = "order.resubmit"  # operator: Error -> Pending
SPAN_WAIT = "order.wait"  # a waiting step claimed: the wait for its event begins (no agent request)
SPAN_EVENT = "order.event"  # an external event for a waiting step: accepted, duplicate or refused
SPAN_CANCEL = "order.cancel"  # a cancel request recorded on the order (or refused, or a no-op)
#: The supervisor acting on one expired order: ``supervisor.retry``, ``supervisor.give_up``,
#: ``supervisor.renudge`` (the verdict), ``supervisor.heal`` (closing a terminal order again).
SPAN_SUPERVISOR_PREFIX = "supervisor."
#: An HTTP client span per call to a remote service: ``POST /reserve``, ``GET /reserve/{key}``.
SPAN_HTTP = "{method} /{route}"

# Span and metric attributes.
ATTR_ORDER_ID = "order.id"
ATTR_STEP = "order.step"
ATTR_KIND = "order.kind"  # action | compensation
ATTR_ATTEMPT = "order.attempt"
ATTR_OUTCOME = "order.outcome"
ATTR_STATE = "order.state"  # Pending, Processing, Processed, Compensated, Error
ATTR_INSTANCE = "faas.instance"  # the host instance (WEBSITE_INSTANCE_ID), as LockedBy names it
ATTR_REMOTE = "remote.service"
ATTR_ACTION = "remote.action"
ATTR_VERDICT = "supervisor.verdict"
ATTR_BREAKER_STATE = "breaker.state"
ATTR_OPERATION = "operation"
ATTR_TRANSPORT = "transport"  # servicebus | storage_queue
ATTR_DROP_REASON = "drop.reason"  # why an internal message was dropped: DROP_*

# Metrics.
METRIC_ORDERS_SUBMITTED = "orders.submitted"  # counter {order.outcome: created, duplicate, rejected}
METRIC_ORDERS_CLOSED = "orders.closed"  # counter {order.state}: orders by final state
METRIC_STEPS_CLAIMED = "steps.claimed"  # counter {order.step, order.kind}: attempts started
METRIC_STEP_DURATION = "steps.duration"  # histogram, s {order.step, order.kind, order.outcome}: claim -> response
METRIC_DEADLINE_MISSES = "steps.deadline_misses"  # counter {order.step, order.kind, supervisor.verdict}
METRIC_STEP_RETRIES = "steps.retries"  # counter {order.step, order.kind}: a line claimed again after a failure
METRIC_COMPENSATIONS = "compensations"  # counter {order.step, order.outcome}: undos that ended (Done, Failed)
METRIC_REMOTE_RETRIES = "remote.retries"  # counter {remote.service, remote.action}: calls after the first
METRIC_BREAKER_CHANGES = "breaker.state_changes"  # counter {remote.service, breaker.state}
METRIC_TABLE_OPERATIONS = "table.operations"  # counter {operation}
METRIC_MESSAGES_SENT = "messages.sent"  # counter {transport, operation}
#: counter {operation: nudge | agent_request | agent_response, drop.reason}: internal
#: messages that could not be acted on, dropped at once (docs/failure-handling.md).
METRIC_MESSAGES_DROPPED = "messages.dropped"

# Why an internal message was dropped (the drop.reason attribute).
DROP_MALFORMED = "malformed"  # not JSON, or not the message's model
DROP_UNTRUSTED = "untrusted"  # parsed, but claims what no copy of the app sends (core/claims.py)
DROP_FORGED = "forged"  # names the row's current ETag with contents that are not the row's

#: Every metric the app records.
METRICS: tuple[str, ...] = (
    METRIC_ORDERS_SUBMITTED,
    METRIC_ORDERS_CLOSED,
    METRIC_STEPS_CLAIMED,
    METRIC_STEP_DURATION,
    METRIC_DEADLINE_MISSES,
    METRIC_STEP_RETRIES,
    METRIC_COMPENSATIONS,
    METRIC_REMOTE_RETRIES,
    METRIC_BREAKER_CHANGES,
    METRIC_TABLE_OPERATIONS,
    METRIC_MESSAGES_SENT,
    METRIC_MESSAGES_DROPPED,
)
