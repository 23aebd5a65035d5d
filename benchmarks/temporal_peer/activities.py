"""The peer's one activity: a step's action or compensation at its remote service, called
exactly as the app's agents call it (``agents/remote.py``): ``POST {base}/{action}`` with
the same body, the same ``Idempotency-Key`` (``core.models.idempotency_key``: one per
order, step and action, stable over every retry) and a ``Complete-By`` header (the
attempt's deadline: Temporal's timeouts), asking ``GET {base}/{action}/{key}`` first on
a retry where the remote offers the lookup. Retries are Temporal's (the activity's retry
policy, ``saga.py``): a transient answer raises a retryable error, a refusal a
non-retryable one.

Async (no thread held while waiting), one aiohttp session (connection pool) per worker
process, as Temporal's docs recommend for I/O-bound activities.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import aiohttp
from temporalio import activity
from temporalio.exceptions import ApplicationError

from agents.remote import TRANSIENT_STATUS, complete_by_header
from benchmarks.temporal_peer.saga import ACTIVITY, PERMANENT, TRANSIENT, RemoteCall
from core.models import idempotency_key


class RemoteActivities:
    """Holds the worker's HTTP session; ``remote_root`` serves remote ``NAME`` at ``{root}/{NAME}``
    (the fake remote's layout, as the local stack's ``REMOTE_<NAME>_URL`` settings are)."""

    def __init__(self, remote_root: str) -> None:
        self.remote_root = remote_root.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @activity.defn(name=ACTIVITY)
    async def call_remote(self, call: RemoteCall) -> dict[str, Any]:
        info = activity.info()
        deadline = info.started_time + info.start_to_close_timeout  # this attempt's own deadline
        if info.schedule_to_close_timeout:
            deadline = min(deadline, info.scheduled_time + info.schedule_to_close_timeout)
        left = (deadline - datetime.now(UTC)).total_seconds()
        base = f"{self.remote_root}/{call.remote}"
        key = idempotency_key(call.order_id, call.step, call.action)
        timeout = aiohttp.ClientTimeout(total=max(0.1, left))
        if info.attempt > 1 and call.lookup:
            # An earlier attempt's outcome may be unknown: ask before sending it again.
            async with self.session().get(f"{base}/{call.action}/{key}", timeout=timeout) as response:
                if response.status == 200:
                    return json.loads(await response.text())
        body: dict[str, Any] = {"order_id": call.order_id, "step": call.step, "kind": call.kind, "attempt": info.attempt,
                                "order": call.order}
        if call.kind == "compensation":
            body["result"] = call.result
        headers = {"Idempotency-Key": key, "Complete-By": complete_by_header(deadline)}
        async with self.session().post(f"{base}/{call.action}", json=body, headers=headers, timeout=timeout) as response:
            status, text = response.status, await response.text()
        if status in TRANSIENT_STATUS:
            raise ApplicationError(f"HTTP {status}", type=TRANSIENT)
        if status >= 400:
            raise ApplicationError(f"HTTP {status}: {text[:500]}", type=PERMANENT, non_retryable=True)
        try:
            return json.loads(text)
        except ValueError as error:
            raise ApplicationError(f"HTTP {status} with a body that is not JSON", type=TRANSIENT) from error
