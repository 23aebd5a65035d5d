"""The process's collaborators, built lazily on first use and then reused.

Blueprints call :func:`services`; tests build :class:`Services` themselves (or call
the plain functions with their own collaborators).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from azure.core.exceptions import HttpResponseError, ServiceResponseError
from pydantic import BaseModel

from adapters import clients, telemetry, transport
from adapters.archive import Archive
from adapters.accounts import ShardedStateStore, check_layout, state_store
from adapters.messaging import Nudger, Publisher
from adapters.order_cache import OrderCache
from adapters.settings import Settings, get_settings
from adapters.store import RejectionStore, StateStore
from core import names

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    #: The order state: one account's store, or the router over several (same interface).
    store: StateStore | ShardedStateStore
    rejections: RejectionStore
    publisher: Publisher
    nudger: Nudger
    instance: str
    #: The orders as this process last wrote them (the scheduler decides on them first);
    #: None: every decision reads the order.
    cache: OrderCache | None = None
    _archive: Archive | None = None

    def archive(self) -> Archive:
        """The archive's container (retention, the archive reads), built on first use."""
        if self._archive is None:
            self._archive = Archive(clients.archive_container(self.settings))
        return self._archive

    @classmethod
    def from_settings(cls, settings: Settings) -> Services:
        accounts = clients.state_table_services(settings)
        tables = accounts[0]  # the rejections, and the breakers' rows, in the first
        _ensure_table(tables, settings.rejections_table)
        for account in accounts:
            _ensure_table(account, settings.orders_table)
        orders = [account.get_table_client(settings.orders_table) for account in accounts]
        check_layout(orders)  # the same accounts in the same order as when the orders were written
        nudges = [clients.queue_client(settings, queue) for queue in settings.scheduler_queues]
        return cls(
            settings=settings,
            # One account: its store; several: each order in the one its id picks (adapters/accounts.py).
            store=state_store([StateStore(table, shards=settings.active_index_shards) for table in orders]),
            rejections=RejectionStore(tables.get_table_client(settings.rejections_table)),
            publisher=Publisher(clients.servicebus_client(settings)),
            nudger=Nudger(nudges),
            instance=instance_id(),
            cache=OrderCache(max_age=settings.pending_timeout),
        )


def _ensure_table(tables, name: str) -> None:
    # In Azure the tables are provisioned by the Bicep and the identity may not be
    # allowed to create them; locally (Azurite) this creates them on first use.
    # A dropped answer (ServiceResponseError: the SDK does not retry this POST) says
    # nothing about the table either: assume it is there, as for a refusal.
    try:
        tables.create_table_if_not_exists(name)
    except (HttpResponseError, ServiceResponseError) as error:
        log.info("could not ensure table %s exists (%s); assuming it is provisioned", name,
                 getattr(error, "reason", None) or type(error).__name__)


M = TypeVar("M", bound=BaseModel)


def parse_or_drop(
    model: type[M], body: bytes, *, what: str, message_id: object, check: Callable[[M], str | None] | None = None
) -> M | None:
    """An internal message parsed and checked at the function's edge, or None when it
    cannot be acted on: malformed (not JSON, not ``model``), or refused by ``check``
    (core/claims.py: what it claims no copy of the app sends). Such a message is
    dropped at once with a log line and counted (``messages.dropped {operation: what}``):
    never raised out of the function, so never redelivered nor dead-lettered, and it
    loses no order (the supervisor recovers any order whose message went missing).
    The rule is the same for every internal queue (docs/failure-handling.md)."""
    shown = str(message_id)[:120]
    try:
        message = model.model_validate_json(body)
    except (ValueError, RecursionError) as error:  # ValidationError is a ValueError
        log.error("malformed %s %s dropped: %s", what, shown, str(error)[:2_000])
        telemetry.message_dropped(what, names.DROP_MALFORMED)
        return None
    reason = check(message) if check is not None else None
    if reason is not None:
        log.error("%s %s for order %s dropped: %s", what, shown, str(getattr(message, "order_id", "?"))[:120], reason)
        telemetry.message_dropped(what, names.DROP_UNTRUSTED)
        return None
    return message


_fallback_instance: tuple[int, str] | None = None  # (pid, name) of this process, when Azure names none


def instance_id() -> str:
    """This host instance, as Azure names it (``WEBSITE_INSTANCE_ID``), else host + pid + a
    random suffix (a restarted process with the same pid is another instance), drawn once
    per process: the claims' ``LockedBy`` and the telemetry's ``faas.instance`` agree."""
    named = os.environ.get("WEBSITE_INSTANCE_ID")
    if named:
        return named
    global _fallback_instance
    pid = os.getpid()
    if _fallback_instance is None or _fallback_instance[0] != pid:
        _fallback_instance = (pid, f"{socket.gethostname()}-{pid}-{uuid.uuid4().hex[:6]}")
    return _fallback_instance[1]


_lock = threading.Lock()
_services: Services | None = None


def services() -> Services:
    global _services
    if _services is None:
        with _lock:
            if _services is None:
                built = Services.from_settings(get_settings())
                telemetry.configure(built.settings, built.instance)  # once per process
                _services = built
    return _services


def reset() -> None:
    """Forget the process's collaborators and settings (tests change settings between runs), and close
    the connections of the storage clients' shared session."""
    global _services
    with _lock:
        if _services is not None:
            _services.publisher.close()
        _services = None
        transport.close_shared_session()
    get_settings.cache_clear()
