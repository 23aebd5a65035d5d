"""Waiting for an outcome: poll with a deadline, never sleep a fixed time and hope."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], *, timeout: float = 20.0, what: str = "the condition", interval: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy and return that; fail naming
    ``what`` when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last value {result!r}")
        time.sleep(interval)
