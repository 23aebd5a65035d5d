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
from dataclasses import dataclass
from typing import TypeVar

from azure.core.exceptions import HttpResponseError
from pydantic import BaseModel

from adapters import clients, telemetry
from adapters.accounts import ShardedStateStore, check_layout, state_store
from adapters.messaging import Nudger, Publisher
from adapters.settings import Settings, get_settings
from adapters.store import RejectionStore, StateStore

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
        )


def _ensure_table(tables, name: str) -> None:
    # In Azure the tables are provisioned by the Bicep and the identity may not be
    # allowed to create them; locally (Azurite) this creates them on first use.
    try:
        tables.create_table_if_not_exists(name)
    except HttpResponseError as error:
        log.info("could not ensure table %s exists (%s); assuming it is provisioned", name, error.reason)


M = TypeVar("M", bound=BaseModel)


def parse_or_drop(model: type[M], body: bytes, *, what: str, message_id: str | None) -> M | None:
    """A message of ours parsed at the function's edge, or None (logged) when it is not
    one: such a message is dropped, never retried, and loses no order (the supervisor
    recovers any order whose message went missing)."""
    try:
        return model.model_validate_json(body)
    except ValueError as error:
        log.error("malformed %s %s dropped: %s", what, message_id, error)
        return None


def instance_id() -> str:
    """This host instance, as Azure names it (``WEBSITE_INSTANCE_ID``), else host + pid."""
    return os.environ.get("WEBSITE_INSTANCE_ID") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


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
    """Forget the process's collaborators and settings (tests change settings between runs)."""
    global _services
    with _lock:
        if _services is not None:
            _services.publisher.close()
        _services = None
    get_settings.cache_clear()
