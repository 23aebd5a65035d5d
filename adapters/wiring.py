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

from adapters import clients, telemetry
from adapters.messaging import Nudger, Publisher
from adapters.settings import Settings, get_settings
from adapters.store import RejectionStore, StateStore
from core import names

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    store: StateStore
    rejections: RejectionStore
    publisher: Publisher
    nudger: Nudger
    instance: str

    @classmethod
    def from_settings(cls, settings: Settings) -> Services:
        tables = clients.table_service(settings)
        for name in (settings.orders_table, settings.rejections_table):
            _ensure_table(tables, name)
        nudges = clients.queue_client(settings, settings.scheduler_queue)
        return cls(
            settings=settings,
            store=StateStore(tables.get_table_client(settings.orders_table), shards=settings.active_index_shards),
            rejections=RejectionStore(tables.get_table_client(settings.rejections_table)),
            publisher=Publisher(clients.servicebus_client(settings)),
            nudger=Nudger(nudges),
            instance=instance_id(),
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
    The rule is the same for every internal queue (README, "Failure handling")."""
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
