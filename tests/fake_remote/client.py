"""Small helpers for calling the fake remote over real HTTP in tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import requests

from tests.polling import wait_until as _wait_until


def fulfil(
    base_url: str,
    order_id: str,
    key: str | None,
    *,
    step: str = "fulfil",
    attempt: int = 1,
    payload: dict[str, Any] | None = None,
    session: requests.Session | None = None,
    timeout: float = 5.0,
) -> requests.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    body = {"order_id": order_id, "step": step, "attempt": attempt, "payload": payload or {"items": 1}}
    post = session.post if session is not None else requests.post
    return post(f"{base_url}/fulfil", json=body, headers=headers, timeout=timeout)


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    """Poll until predicate() is truthy; fail after the deadline."""
    return _wait_until(predicate, timeout=timeout, what=what, interval=0.01)
