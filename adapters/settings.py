"""One Settings class, read from app settings (environment variables).

Built lazily by :func:`get_settings`: an exception at import time would keep the
Functions host from indexing any function, so nothing here runs on import.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from functools import lru_cache
from typing import Annotated

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core import names
from core.access import ApiAuth
from core.workflow import MAX_TIMEOUT_SECONDS, StepPolicy, remotes


class MissingSetting(ValueError):
    """A setting that this function needs is not set."""


def _setting(name: str, default, **kwargs):
    return Field(default, validation_alias=AliasChoices(name), **kwargs)


PositiveSeconds = Annotated[float, Field(gt=0)]


class Settings(BaseSettings):
    """Every setting the app reads, by its app-setting name (see docs/settings.md)."""

    model_config = SettingsConfigDict(env_ignore_empty=True, extra="ignore", populate_by_name=False)

    # --- Connections: a connection string locally, identity-based in Azure -------
    storage_connection_string: str | None = _setting(names.STORAGE_CONNECTION, None)
    storage_account_name: str | None = _setting(f"{names.STORAGE_CONNECTION}__accountName", None)
    storage_table_service_uri: str | None = _setting(f"{names.STORAGE_CONNECTION}__tableServiceUri", None)
    storage_queue_service_uri: str | None = _setting(f"{names.STORAGE_CONNECTION}__queueServiceUri", None)
    storage_client_id: str | None = _setting(f"{names.STORAGE_CONNECTION}__clientId", None)

    #: Optional: the order state's own account (docs/scale.md); unset, the tables are in
    #: AzureWebJobsStorage's account. Same forms: a connection string, or identity-based.
    state_storage_connection_string: str | None = _setting(names.STATE_STORAGE_CONNECTION, None)
    state_storage_account_name: str | None = _setting(f"{names.STATE_STORAGE_CONNECTION}__accountName", None)
    state_storage_table_service_uri: str | None = _setting(f"{names.STATE_STORAGE_CONNECTION}__tableServiceUri", None)
    state_storage_client_id: str | None = _setting(f"{names.STATE_STORAGE_CONNECTION}__clientId", None)
    #: Optional: the order state over several accounts (adapters/accounts.py), comma-separated:
    #: account names or table service URIs (identity-based), or connection strings (locally).
    #: Fixed for the deployment's life: an order lives in the account its id picks.
    state_storage_accounts: str | None = _setting(names.STATE_STORAGE_ACCOUNTS_SETTING, None)

    #: Optional: the archive's own account (docs/retention.md); unset, AzureWebJobsStorage's.
    #: Locally a connection string; in Azure ``ArchiveStorage__blobServiceUri`` (identity-based).
    archive_storage_connection_string: str | None = _setting(names.ARCHIVE_STORAGE_CONNECTION, None)
    archive_storage_blob_service_uri: str | None = _setting(f"{names.ARCHIVE_STORAGE_CONNECTION}__blobServiceUri", None)
    archive_storage_client_id: str | None = _setting(f"{names.ARCHIVE_STORAGE_CONNECTION}__clientId", None)
    storage_blob_service_uri: str | None = _setting(f"{names.STORAGE_CONNECTION}__blobServiceUri", None)

    servicebus_connection_string: str | None = _setting(names.SERVICEBUS_CONNECTION, None)
    servicebus_namespace: str | None = _setting(f"{names.SERVICEBUS_CONNECTION}__fullyQualifiedNamespace", None)
    servicebus_client_id: str | None = _setting(f"{names.SERVICEBUS_CONNECTION}__clientId", None)

    # --- Names (defaults from core.names) -------------------------------------
    orders_queue: str = _setting(names.ORDERS_QUEUE_SETTING, names.ORDERS_QUEUE)
    order_events_queue: str = _setting(names.ORDER_EVENTS_QUEUE_SETTING, names.ORDER_EVENTS_QUEUE)
    cancellations_queue: str = _setting(names.CANCELLATIONS_QUEUE_SETTING, names.CANCELLATIONS_QUEUE)
    #: remote service -> its agent's request queue (app settings ``<NAME>_REQUESTS_QUEUE``).
    requests_queues: dict[str, str] = Field(default_factory=dict, validation_alias=AliasChoices("REQUESTS_QUEUES"))
    agent_responses_queue: str = _setting(names.AGENT_RESPONSES_QUEUE_SETTING, names.AGENT_RESPONSES_QUEUE)
    alerts_queue: str = _setting(names.ALERTS_QUEUE_SETTING, names.ALERTS_QUEUE)
    #: The single scheduler queue of before the sharding (drained by ``schedule_order``).
    scheduler_queue: str = _setting(names.SCHEDULER_QUEUE_SETTING, names.SCHEDULER_QUEUE)
    #: The scheduler's queues by shard (app settings ``SCHEDULER_QUEUE_<n>``): an order's
    #: nudges go to the one ``names.scheduler_queue_shard`` picks.
    scheduler_queues: tuple[str, ...] = Field(default=(), validation_alias=AliasChoices("SCHEDULER_QUEUES"))
    orders_table: str = _setting(names.ORDERS_TABLE_SETTING, names.ORDERS_TABLE)
    rejections_table: str = _setting(names.REJECTIONS_TABLE_SETTING, names.REJECTIONS_TABLE)

    # --- The remote services the agents call --------------------------------------
    #: remote service -> base URL, from the app settings ``REMOTE_<NAME>_URL`` (one per
    #: remote service of core.workflow). Read by that remote's agent, which fails with
    #: a clear error naming the setting when it is missing.
    remote_urls: dict[str, str] = Field(default_factory=dict, validation_alias=AliasChoices("REMOTE_URLS"))
    #: Per-call timeout; each call also stops at the step's complete-by time.
    remote_call_timeout_seconds: PositiveSeconds = _setting("REMOTE_CALL_TIMEOUT_SECONDS", 10.0)
    #: The agent's own retries within one step attempt (first call included).
    agent_max_calls: int = _setting("AGENT_MAX_CALLS", 6, ge=1, le=100)
    agent_backoff_initial_seconds: PositiveSeconds = _setting("AGENT_BACKOFF_INITIAL_SECONDS", 0.2, le=MAX_TIMEOUT_SECONDS)
    agent_backoff_max_seconds: PositiveSeconds = _setting("AGENT_BACKOFF_MAX_SECONDS", 5.0, le=MAX_TIMEOUT_SECONDS)
    #: The agents' circuit breaker, per remote service per host instance (agents/breaker.py):
    #: it opens when, over the last BREAKER_SAMPLING_SECONDS, at least
    #: BREAKER_MINIMUM_THROUGHPUT distinct requests called the service and at least
    #: BREAKER_FAILURE_RATIO of them failed transiently (a request counts once, however
    #: often it retries); then no call for BREAKER_OPEN_SECONDS, and its lines that could
    #: not call are postponed, not failed; then one trial call.
    breaker_failure_ratio: float = _setting("BREAKER_FAILURE_RATIO", 0.5, gt=0, le=1)
    breaker_minimum_throughput: int = _setting("BREAKER_MINIMUM_THROUGHPUT", 5, ge=2, le=100_000)
    breaker_sampling_seconds: PositiveSeconds = _setting("BREAKER_SAMPLING_SECONDS", 30.0)
    breaker_open_seconds: PositiveSeconds = _setting("BREAKER_OPEN_SECONDS", 30.0)
    #: A line postponed this many times in a row (its service down for everyone) counts
    #: one failed attempt: an outage of about this many open periods per failure,
    #: MAX_FAILURES failures, ends in the failure path (undo, or Error with an alert).
    max_postponements: int = _setting("MAX_POSTPONEMENTS", 10, ge=1, le=1000)
    #: The bulkhead: calls to one remote service in flight from one host instance at most.
    remote_max_concurrent_calls: int = _setting("REMOTE_MAX_CONCURRENT_CALLS", 16, ge=1, le=1000)

    # --- Scheduler and supervisor policy --------------------------------------
    #: How long one attempt of a step may take (claim -> response) before the
    #: supervisor counts it as failed.
    step_timeout_seconds: PositiveSeconds = _setting("STEP_TIMEOUT_SECONDS", 30.0, le=MAX_TIMEOUT_SECONDS)
    #: How long a Pending row may wait for the scheduler before the supervisor
    #: nudges it again (a lost nudge); no failure is counted for it.
    pending_timeout_seconds: PositiveSeconds = _setting("PENDING_TIMEOUT_SECONDS", 30.0)
    #: How long past an attempt's deadline the supervisor still awaits its answer before it
    #: counts the attempt as failed: the agent never acts past the deadline, but its response
    #: may be held up in the app's own queues under Azure's push-back (docs/scale.md, "The
    #: soak under push-back"). 0: judged at the deadline.
    response_grace_seconds: float = _setting("RESPONSE_GRACE_SECONDS", 0.0, ge=0, le=3600)
    #: A waiting step's deadline (an approval) when its workflow fixes none: the line's
    #: Complete-By is its claim plus this; past it the supervisor gives the wait up and the
    #: steps before it are undone (docs/workflows.md, "Waiting steps").
    approval_timeout_seconds: PositiveSeconds = _setting(
        names.APPROVAL_TIMEOUT_SETTING, names.DEFAULT_APPROVAL_TIMEOUT_SECONDS,
        le=names.MAX_APPROVAL_TIMEOUT_SECONDS,
    )
    #: Failures (expired attempts) after which the line is given up: the steps before it are
    #: undone (Compensated; Error + alert only if an undo fails, or the line cannot be undone).
    max_failures: int = _setting("MAX_FAILURES", 3, ge=1, le=100)
    #: The supervisor's retry nudge waits base * 2**(failures-1), capped.
    retry_backoff_base_seconds: float = _setting("RETRY_BACKOFF_BASE_SECONDS", 2.0, ge=0)
    retry_backoff_max_seconds: float = _setting("RETRY_BACKOFF_MAX_SECONDS", 300.0, ge=0)
    #: NCRONTAB (six fields, seconds first); read by the timer binding as %SUPERVISOR_SCHEDULE%.
    supervisor_schedule: str = _setting(names.SUPERVISOR_SCHEDULE_SETTING, names.DEFAULT_SUPERVISOR_SCHEDULE)
    #: Partitions of the active index (adapters/store.py). Changing it with orders in
    #: flight loses none: the sweep reads every index partition and moves each row to its
    #: shard under the new count (docs/scale.md, "The active index, sharded").
    active_index_shards: int = _setting(
        names.ACTIVE_INDEX_SHARDS_SETTING, names.DEFAULT_ACTIVE_INDEX_SHARDS, ge=1, le=names.MAX_ACTIVE_INDEX_SHARDS
    )

    # --- Bulk resubmit by cause (api/search.py, supervisor/bulk.py) --------------------
    #: ``POST /api/errors/{group}/resubmit`` resubmits at most this many orders per second...
    bulk_resubmit_per_second: float = _setting(names.BULK_RESUBMIT_RATE_SETTING, 20.0, gt=0, le=1000)
    #: ...and at most this many per request (then answers with a continuation).
    bulk_resubmit_batch: int = _setting(names.BULK_RESUBMIT_BATCH_SETTING, 100, ge=1, le=1000)
    # --- Retention (adapters/retention.py, docs/retention.md) --------------------------
    #: Finished orders that ended this many days ago or more are archived, then deleted.
    retention_days: float = _setting(names.RETENTION_DAYS_SETTING, names.DEFAULT_RETENTION_DAYS, ge=0, le=36_500)
    #: Error orders are archived and deleted too (default: they stay for an operator).
    retention_include_error: bool = _setting(names.RETENTION_INCLUDE_ERROR_SETTING, False)
    #: The most orders one retention tick archives and deletes.
    retention_max_orders: int = _setting(
        names.RETENTION_MAX_ORDERS_SETTING, names.DEFAULT_RETENTION_MAX_ORDERS, ge=1, le=100_000
    )
    #: NCRONTAB (six fields), read by the timer binding as %RETENTION_SCHEDULE%.
    retention_schedule: str = _setting(names.RETENTION_SCHEDULE_SETTING, names.DEFAULT_RETENTION_SCHEDULE)
    archive_container: str = _setting(names.ARCHIVE_CONTAINER_SETTING, names.ARCHIVE_CONTAINER)
    #: Local tests only (never set by the Bicep): ``exit-after-archive`` ends the process
    #: right after a tick's archive step, before it deletes anything, as a crash there would.
    retention_fault: str | None = _setting(
        names.RETENTION_FAULT_SETTING, None, pattern=f"^{names.RETENTION_FAULT_EXIT}$"
    )

    # --- The status API (api/, core/access.py) ---------------------------------------
    #: easyauth (Azure: app roles from App Service Authentication), none (the local
    #: stack, loopback only) or disabled (every call refused: the default).
    api_auth: ApiAuth = _setting(names.API_AUTH_SETTING, ApiAuth.DISABLED)

    # --- Telemetry (adapters/telemetry.py, docs/observability.md) ---------------------
    #: Azure: traces and metrics to this Application Insights component...
    applicationinsights_connection_string: str | None = _setting(names.APPINSIGHTS_CONNECTION_SETTING, None)
    #: ...with the Entra ID token of the identity this names (``Authorization=AAD;ClientId=...``).
    applicationinsights_authentication_string: str | None = _setting(names.APPINSIGHTS_AUTHENTICATION_SETTING, None)
    #: Locally: spans, and metric points, appended as JSON lines to these files.
    spans_file: str | None = _setting(names.SPANS_FILE_SETTING, None)
    metrics_file: str | None = _setting(names.METRICS_FILE_SETTING, None)
    #: Locally: every host's spans files (a glob), read by the operator page for an order's
    #: timeline; unset, the host's own spans file (api/ops.py).
    trace_spans_files: str | None = _setting(names.TRACE_SPANS_FILES_SETTING, None)
    #: Azure: the workspace id of the component's Log Analytics workspace, queried by the
    #: operator page for an order's spans (adapters/traces.py) with the app's identity.
    applicationinsights_workspace_id: str | None = _setting(names.APPINSIGHTS_WORKSPACE_SETTING, None)

    @model_validator(mode="before")
    @classmethod
    def _collect_per_remote(cls, data):
        # Settings per remote service, named after it: not fields of their own, so a new
        # remote in core.workflow needs no change here.
        if not isinstance(data, dict):
            return data

        def setting(name: str) -> str | None:
            value = data.get(name) or os.environ.get(name)
            return value.strip() if value and value.strip() else None

        urls, queues = dict(data.get("REMOTE_URLS") or {}), dict(data.get("REQUESTS_QUEUES") or {})
        for remote in remotes():
            if url := setting(names.remote_url_setting(remote)):
                urls.setdefault(remote, url)
            queues.setdefault(remote, setting(names.requests_queue_setting(remote)) or names.requests_queue(remote))
        schedulers = tuple(
            setting(setting_name) or name for name, setting_name in names.SCHEDULER_QUEUES
        )
        return {**data, "REMOTE_URLS": urls, "REQUESTS_QUEUES": queues, "SCHEDULER_QUEUES": schedulers}

    def remote_url(self, remote: str) -> str:
        """The base URL of a remote service; raises :class:`MissingSetting` naming the setting."""
        url = self.remote_urls.get(remote)
        if not url:
            raise MissingSetting(
                f"no base URL for remote service {remote!r}: set the app setting {names.remote_url_setting(remote)}"
            )
        return url

    def state_accounts(self) -> tuple[str, ...]:
        """The order state's accounts as listed in ``STATE_STORAGE_ACCOUNTS`` (empty when
        unset: one account, ``StateStorage``'s or the host's). Checked when settings are read."""
        if not self.state_storage_accounts:
            return ()
        return tuple(item.strip() for item in self.state_storage_accounts.split(","))

    def own_queues(self) -> frozenset[str]:
        """The app's own Service Bus queues (a submitter's ReplyTo may not name one)."""
        return frozenset(
            {
                self.orders_queue, self.order_events_queue, self.cancellations_queue, self.agent_responses_queue,
                self.alerts_queue,
                *self.requests_queues.values(),
            }
        )

    def step_defaults(self) -> StepPolicy:
        """The app settings' step policy: what a step's own policy does not set."""
        return StepPolicy(
            timeout_seconds=self.step_timeout_seconds,
            max_failures=self.max_failures,
            agent_max_calls=self.agent_max_calls,
            agent_backoff_initial=self.agent_backoff_initial_seconds,
            agent_backoff_max=self.agent_backoff_max_seconds,
            wait_timeout_seconds=self.approval_timeout_seconds,
        )

    def telemetry_identity(self) -> tuple[bool, str | None]:
        """(Entra ID ingestion?, the identity's client id) from APPLICATIONINSIGHTS_AUTHENTICATION_STRING,
        read as the Functions host reads it: ``Authorization=AAD`` and an optional ``ClientId``."""
        pairs = dict(
            part.split("=", 1) for part in (self.applicationinsights_authentication_string or "").split(";") if "=" in part
        )
        pairs = {key.strip().lower(): value.strip() for key, value in pairs.items()}
        return pairs.get("authorization", "").upper() == "AAD", pairs.get("clientid") or None

    @property
    def step_timeout(self) -> timedelta:
        return timedelta(seconds=self.step_timeout_seconds)

    @property
    def pending_timeout(self) -> timedelta:
        return timedelta(seconds=self.pending_timeout_seconds)

    @property
    def response_grace(self) -> timedelta:
        return timedelta(seconds=self.response_grace_seconds)

    @model_validator(mode="after")
    def _connections_present(self) -> Settings:
        if not (self.storage_connection_string or self.storage_account_name or self.storage_table_service_uri):
            raise ValueError(
                f"no storage connection: set {names.STORAGE_CONNECTION} (a connection string, "
                f"e.g. UseDevelopmentStorage=true) or {names.STORAGE_CONNECTION}__accountName"
            )
        _check_state_accounts(self.state_accounts())
        if not (self.servicebus_connection_string or self.servicebus_namespace):
            raise ValueError(
                f"no Service Bus connection: set {names.SERVICEBUS_CONNECTION} (a connection string) "
                f"or {names.SERVICEBUS_CONNECTION}__fullyQualifiedNamespace"
            )
        return self


#: A storage account's name: 3 to 24 lower-case letters and digits.
_ACCOUNT_NAME = re.compile(r"^[a-z0-9]{3,24}$")


def state_account_kind(item: str) -> str:
    """What one entry of ``STATE_STORAGE_ACCOUNTS`` is: ``connection`` (a connection string),
    ``uri`` (a table service URI) or ``name`` (an account name); raises ValueError otherwise."""
    if "=" in item:
        return "connection"
    if item.startswith(("https://", "http://")):
        return "uri"
    if _ACCOUNT_NAME.match(item):
        return "name"
    raise ValueError(
        f"{item!r} is not a storage account name (3-24 lower-case letters and digits), a table service "
        "URI (https://...) or a connection string (...;AccountName=...;...)"
    )


def _check_state_accounts(items: tuple[str, ...]) -> None:
    """Refuse a malformed ``STATE_STORAGE_ACCOUNTS``: an order's account is picked from the
    list's length and order, so a list read wrongly would look for orders where they are not."""
    if not items:
        return
    setting = names.STATE_STORAGE_ACCOUNTS_SETTING
    if any(not item for item in items):
        raise ValueError(f"{setting} has an empty entry: a comma-separated list of accounts, no empty items")
    if len(items) > names.MAX_STATE_STORAGE_ACCOUNTS:
        raise ValueError(f"{setting} lists {len(items)} accounts; at most {names.MAX_STATE_STORAGE_ACCOUNTS}")
    if len(set(items)) != len(items):
        raise ValueError(f"{setting} lists an account twice: each order would have two homes")
    for item in items:
        try:
            state_account_kind(item)
        except ValueError as error:
            raise ValueError(f"{setting}: {error}") from error


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The app's settings, read once from the environment on first use."""
    return Settings()
