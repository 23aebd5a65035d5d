"""Small helpers for calling the fake remote over real HTTP in tests, as the agents do."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import requests

from devtools.fake_remote import DEFAULT_SERVICES
from tests.polling import wait_until as _wait_until

#: Leave a field out of the request.
OMIT: Any = object()

#: compensation -> the forward action it undoes, in the default services.
_UNDOES = {comp: action for actions in DEFAULT_SERVICES.values() for action, comp in actions.items() if comp}


def complete_by_header(when: datetime) -> str:
    """RFC 3339 UTC with milliseconds, as the agents send it."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def call(
    url: str,
    order_id: str,
    key: str | None,
    *,
    service: str = "inventory",
    action: str = "reserve",
    step: str | None = None,
    kind: str | None = None,
    attempt: int = 1,
    order: dict[str, Any] | None = None,
    result: Any = OMIT,
    complete_by: datetime | str | None | Any = OMIT,
    session: requests.Session | None = None,
    timeout: float = 5.0,
    headers: dict[str, str] | None = None,
) -> requests.Response:
    """``POST {url}/{service}/{action}`` with a well-formed body and headers.

    By default: a forward ``reserve`` at ``inventory``; ``step`` is the forward action
    (for a compensation, the action it undoes); ``kind`` follows from the action;
    ``Complete-By`` is a minute from now (``None``: no header; a string: sent as is);
    a compensation carries ``result: null`` unless one is given; ``headers`` are added
    (e.g. a ``traceparent``).
    """
    is_compensation = action in _UNDOES
    kind = kind or ("compensation" if is_compensation else "action")
    body: dict[str, Any] = {
        "order_id": order_id,
        "step": step or _UNDOES.get(action, action),
        "attempt": attempt,
        "order": order if order is not None else {"order_id": order_id, "items": 1},
        "kind": kind,
    }
    if result is not OMIT:
        body["result"] = result
    elif kind == "compensation":
        body["result"] = None
    headers = {**(headers or {}), **({} if key is None else {"Idempotency-Key": key})}
    if complete_by is OMIT:
        complete_by = datetime.now(UTC) + timedelta(seconds=60)
    if isinstance(complete_by, datetime):
        complete_by = complete_by_header(complete_by)
    if complete_by is not None:
        headers["Complete-By"] = complete_by
    post = session.post if session is not None else requests.post
    return post(f"{url}/{service}/{action}", json=body, headers=headers, timeout=timeout)


def reserve(url: str, order_id: str, key: str | None, **kwargs: Any) -> requests.Response:
    """The forward action most tests use: ``POST {url}/inventory/reserve``."""
    return call(url, order_id, key, service="inventory", action="reserve", **kwargs)


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    """Poll until predicate() is truthy; fail after the deadline."""
    return _wait_until(predicate, timeout=timeout, what=what, interval=0.01)
