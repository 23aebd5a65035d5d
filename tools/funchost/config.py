"""Settings the host reads before it imports the app: local.settings.json and host.json.

- ``local.settings.json``: its ``Values`` become environment variables (app settings)
  before the app is imported. A variable that is already set wins, so a test or a
  shell can override any value.
- ``local.settings.json``'s ``Host`` section: ``LocalHttpPort``, the port of the HTTP
  server (as Core Tools reads it).
- ``host.json``: the extension settings this host honours (``extensions.queues``,
  ``extensions.serviceBus``, ``extensions.http.routePrefix``) and the log level. As in Azure, any host.json value can
  be overridden by an app setting named ``AzureFunctionsJobHost__path__to__key``
  (for example ``AzureFunctionsJobHost__extensions__queues__batchSize=4``).
- ``%SETTING%`` in a binding property is replaced by that app setting's value.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from .schedule import parse_timespan

HOST_OVERRIDE_PREFIX = "AzureFunctionsJobHost__"
#: This host's own knob (not an Azure setting): how long a storage queue message being
#: processed stays invisible, renewed at half-time. Azure's host uses 10 minutes, which
#: is also how long a message taken by a crashed instance stays out of sight.
QUEUE_LEASE_SETTING = "FUNCHOST_QUEUE_LEASE_SECONDS"
#: This host's own knob too: how far apart the worker processes after the first start
#: (``FUNCTIONS_WORKER_PROCESS_COUNT`` > 1). The Functions host's ``ProcessStartupInterval``
#: is 10 s (its worker configuration can change it; an app setting cannot).
WORKER_STARTUP_INTERVAL_SETTING = "FUNCHOST_WORKER_STARTUP_INTERVAL_SECONDS"
DEFAULT_WORKER_STARTUP_INTERVAL = 10.0
_PERCENT = re.compile(r"%([^%]+)%")

_LOG_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "information": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "none": logging.CRITICAL + 10,
}


class ConfigError(ValueError):
    """A settings file or a binding property the host cannot use."""


# --- local.settings.json -------------------------------------------------------------


def read_local_settings(path: Path) -> dict[str, str]:
    """The ``Values`` of a local.settings.json file; ``{}`` when the file does not exist."""
    if not path.exists():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path.name} is not valid JSON: {error}") from error
    if document.get("IsEncrypted"):
        raise ConfigError(f"{path.name} is encrypted (IsEncrypted=true); this host reads plain values only")
    values = document.get("Values") or {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path.name}: Values must be an object")
    return {str(key): "" if value is None else str(value) for key, value in values.items()}


def read_local_http_port(path: Path) -> int | None:
    """``Host.LocalHttpPort`` of a local.settings.json file (Core Tools' port setting); None when absent."""
    if not path.exists():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path.name} is not valid JSON: {error}") from error
    value = _get(document.get("Host") or {}, "LocalHttpPort")
    if value in (None, ""):
        return None
    try:
        port = int(value)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{path.name}: Host.LocalHttpPort {value!r} is not a port number") from error
    if not 0 <= port <= 65535:
        raise ConfigError(f"{path.name}: Host.LocalHttpPort {port} is not a port number")
    return port


def apply_settings(values: Mapping[str, str], environ: os._Environ | dict | None = None) -> list[str]:
    """Set each value as an environment variable unless one is already set; return the names set."""
    environ = os.environ if environ is None else environ
    applied = []
    for key, value in values.items():
        if key not in environ:
            environ[key] = value
            applied.append(key)
    return applied


def resolve(value: Any, environ: Mapping[str, str] | None = None) -> Any:
    """Replace every ``%NAME%`` in a string by the app setting ``NAME``; other values pass through.

    A missing setting is an error, as in the Functions host ("does not resolve to a value").
    """
    if not isinstance(value, str):
        return value
    environ = os.environ if environ is None else environ

    def lookup(match: re.Match) -> str:
        name = match.group(1)
        if name not in environ:
            raise ConfigError(f"'%{name}%' does not resolve to a value: app setting {name!r} is not set")
        return environ[name]

    return _PERCENT.sub(lookup, value)


# --- host.json -----------------------------------------------------------------------


def _get(section: Mapping[str, Any] | None, key: str, default: Any = None) -> Any:
    """Case-insensitive lookup, as the Functions host reads host.json."""
    if not section:
        return default
    for name, value in section.items():
        if name.lower() == key.lower():
            return value
    return default


def _set_path(document: dict, path: list[str], value: str) -> None:
    node = document
    for part in path[:-1]:
        existing = next((k for k in node if k.lower() == part.lower()), None)
        if existing is None or not isinstance(node[existing], dict):
            existing = existing or part
            node[existing] = {}
        node = node[existing]
    leaf = next((k for k in node if k.lower() == path[-1].lower()), path[-1])
    node[leaf] = value


def read_host_json(path: Path, environ: Mapping[str, str] | None = None) -> dict:
    """host.json (``{}`` if missing) with ``AzureFunctionsJobHost__...`` overrides applied."""
    environ = os.environ if environ is None else environ
    document: dict = {}
    if path.exists():
        try:
            document = json.loads(path.read_text(encoding="utf-8-sig"))
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path.name} is not valid JSON: {error}") from error
    for key, value in sorted(environ.items()):
        if key.startswith(HOST_OVERRIDE_PREFIX) and len(key) > len(HOST_OVERRIDE_PREFIX):
            _set_path(document, key[len(HOST_OVERRIDE_PREFIX) :].split("__"), value)
    return document


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"host.json {name}: {value!r} is not an integer") from error


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def _span(value: Any, name: str) -> timedelta:
    try:
        return parse_timespan(value)
    except ValueError as error:
        raise ConfigError(f"host.json {name}: {error}") from error


@dataclass(frozen=True)
class QueueOptions:
    """``extensions.queues``, with the Functions defaults."""

    max_polling_interval: timedelta = timedelta(minutes=1)
    visibility_timeout: timedelta = timedelta(0)
    batch_size: int = 16
    new_batch_threshold: int = 8
    max_dequeue_count: int = 5
    message_encoding: str = "base64"
    lease: timedelta = timedelta(minutes=10)


@dataclass(frozen=True)
class ServiceBusOptions:
    """``extensions.serviceBus``, with the Functions defaults."""

    prefetch_count: int = 0
    auto_complete_messages: bool = True
    max_auto_lock_renewal_duration: timedelta = timedelta(minutes=5)
    max_concurrent_calls: int = 16


@dataclass(frozen=True)
class HttpOptions:
    """``extensions.http``: the route prefix of every HTTP function (default ``api``; ``""`` for none)."""

    route_prefix: str = "api"


#: ``functionTimeout`` when host.json sets none: 30 minutes on Flex Consumption, the plan the Bicep deploys
#: (Microsoft Learn, "Azure Functions hosting options", function app time-out duration; "-1" lifts the limit).
DEFAULT_FUNCTION_TIMEOUT = timedelta(minutes=30)


def _function_timeout(value: Any) -> timedelta | None:
    if value is None:
        return DEFAULT_FUNCTION_TIMEOUT
    if str(value).strip() == "-1":
        return None
    span = _span(value, "functionTimeout")
    if span <= timedelta(0):
        raise ConfigError(f"host.json functionTimeout must be positive (or -1 for none), got {value!r}")
    return span


@dataclass(frozen=True)
class HostOptions:
    queues: QueueOptions
    service_bus: ServiceBusOptions
    log_level: int
    raw: dict
    http: HttpOptions = HttpOptions()
    #: host.json ``functionTimeout``: past it an invocation fails and its worker restarts; None: no limit.
    function_timeout: timedelta | None = DEFAULT_FUNCTION_TIMEOUT
    #: Seconds between the starts of the worker processes after the first.
    worker_startup_interval: float = DEFAULT_WORKER_STARTUP_INTERVAL


def host_options(document: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> HostOptions:
    """Read the settings this host honours from a host.json document (and its own lease knob)."""
    environ = {} if environ is None else environ
    lease_text = environ.get(QUEUE_LEASE_SETTING)
    try:
        lease = timedelta(seconds=float(lease_text)) if lease_text else timedelta(minutes=10)
    except ValueError as error:
        raise ConfigError(f"{QUEUE_LEASE_SETTING}: {lease_text!r} is not a number of seconds") from error
    if lease < timedelta(seconds=2):
        raise ConfigError(f"{QUEUE_LEASE_SETTING} must be at least 2 seconds (it is renewed at half-time)")
    extensions = _get(document, "extensions", {}) or {}

    queues = _get(extensions, "queues", {}) or {}
    batch_size = _int(_get(queues, "batchSize", 16), "extensions.queues.batchSize")
    if not 1 <= batch_size <= 32:
        raise ConfigError(f"host.json extensions.queues.batchSize must be 1-32, got {batch_size}")
    encoding = str(_get(queues, "messageEncoding", "base64")).lower()
    if encoding not in ("base64", "none"):
        raise ConfigError(f"host.json extensions.queues.messageEncoding must be base64 or none, got {encoding!r}")
    max_polling = _span(_get(queues, "maxPollingInterval", "00:01:00"), "extensions.queues.maxPollingInterval")
    queue_options = QueueOptions(
        max_polling_interval=max(max_polling, timedelta(milliseconds=100)),
        visibility_timeout=_span(_get(queues, "visibilityTimeout", "00:00:00"), "extensions.queues.visibilityTimeout"),
        batch_size=batch_size,
        # Azure's default: batchSize / 2 per vCPU (host.json reference, "queues").
        new_batch_threshold=_int(
            _get(queues, "newBatchThreshold", batch_size // 2 * (os.cpu_count() or 1)), "newBatchThreshold"
        ),
        max_dequeue_count=max(1, _int(_get(queues, "maxDequeueCount", 5), "extensions.queues.maxDequeueCount")),
        message_encoding=encoding,
        lease=lease,
    )

    service_bus = _get(extensions, "serviceBus", {}) or {}
    # Extension 4.x kept the concurrency under messageHandlerOptions; 5.x at the top.
    legacy = _get(service_bus, "messageHandlerOptions", {}) or {}
    concurrent = _get(service_bus, "maxConcurrentCalls", _get(legacy, "maxConcurrentCalls", 16 * (os.cpu_count() or 1)))
    auto_complete = _get(service_bus, "autoCompleteMessages", _get(legacy, "autoComplete", True))
    renewal = _get(service_bus, "maxAutoLockRenewalDuration", _get(legacy, "maxAutoRenewDuration", "00:05:00"))
    sb_options = ServiceBusOptions(
        prefetch_count=max(0, _int(_get(service_bus, "prefetchCount", 0), "extensions.serviceBus.prefetchCount")),
        auto_complete_messages=_bool(auto_complete),
        max_auto_lock_renewal_duration=_span(renewal, "extensions.serviceBus.maxAutoLockRenewalDuration"),
        max_concurrent_calls=max(1, _int(concurrent, "extensions.serviceBus.maxConcurrentCalls")),
    )

    http = _get(extensions, "http", {}) or {}
    prefix = _get(http, "routePrefix", "api")
    if not isinstance(prefix, str):
        raise ConfigError(f"host.json extensions.http.routePrefix must be a string, got {prefix!r}")
    http_options = HttpOptions(route_prefix=prefix.strip().strip("/"))

    levels = _get(_get(document, "logging", {}) or {}, "logLevel", {}) or {}

    default_level = _LOG_LEVELS.get(str(_get(levels, "default", "Information")).lower(), logging.INFO)
    return HostOptions(
        queues=queue_options, service_bus=sb_options, log_level=default_level, raw=dict(document), http=http_options,
        function_timeout=_function_timeout(_get(document, "functionTimeout")),
        worker_startup_interval=_seconds(environ, WORKER_STARTUP_INTERVAL_SETTING, DEFAULT_WORKER_STARTUP_INTERVAL),
    )


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError as error:
        raise ConfigError(f"{name}: {text!r} is not a number of seconds") from error
    if value < 0:
        raise ConfigError(f"{name} cannot be negative")
    return value
