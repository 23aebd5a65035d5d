"""``ordersctl list --customer``, ``ordersctl errors`` and ``ordersctl resubmit --group``:
the API's documents (api/search.py), printed as JSON, read and written with the same
collaborators as the other commands."""

from __future__ import annotations

import json
from collections.abc import Callable

from api import search as api
from api.orders import Reply
from core.models import utcnow


def _printed(reply: Reply, fail: Callable[[str], Exception]) -> dict:
    if reply.status >= 400:
        raise fail(reply.body["reason"])
    print(json.dumps(reply.body, indent=2))
    return reply.body


def by_customer(services, fail, *, customer: str, since: str | None, until: str | None, limit: int,
                continuation: str | None) -> None:
    params = {"customer": customer, "limit": str(limit)}
    params.update({k: v for k, v in (("since", since), ("until", until), ("continuation", continuation)) if v})
    _printed(_answer(lambda: api.list_by_customer(params, store=services.store)), fail)


def errors(services, fail, *, limit: int, continuation: str | None) -> None:
    params = {"limit": str(limit), **({"continuation": continuation} if continuation else {})}
    _printed(_answer(lambda: api.list_errors(params, store=services.store)), fail)


def resubmit_group(services, fail, *, group: str) -> None:
    """The whole group, one bounded call after the other (each at the app's rate), as a client
    of ``POST /api/errors/{group}/resubmit`` follows its continuation; one JSON line per call."""
    params: dict[str, str] = {}
    while True:
        reply = _answer(lambda: api.resubmit_errors(
            group, params, store=services.store, nudger=services.nudger, now=utcnow,
            pending_timeout=services.settings.pending_timeout,
            per_second=services.settings.bulk_resubmit_per_second, batch=services.settings.bulk_resubmit_batch,
        ))
        if reply.status >= 400:
            raise fail(reply.body["reason"])
        print(json.dumps(reply.body))
        if reply.body["done"]:
            return
        params = {"continuation": reply.body["continuation"]}


def _answer(action: Callable[[], Reply]) -> Reply:
    """The reply, with a refused input as the API answers it (400 and its reason)."""
    try:
        return action()
    except api.BadRequest as error:
        return Reply(400, {"error": "bad_request", "reason": str(error)})
