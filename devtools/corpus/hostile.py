"""The hostile internal-messages corpus (``hostile_messages.json``): what someone with
send rights on one internal queue could write, each case an edit of a message the app
really sends about an order that is already Processed.

A case names its ``queue`` (``agent-responses``, ``scheduler``, ``inventory-requests``:
the settings' names in a deployment), either a ``raw`` body or a ``set`` of edits by
dotted path on the base message of that queue (:func:`base_messages`), and what must
happen: ``{"dropped": "malformed" | "untrusted" | "forged"}`` (dropped at once, counted
as ``messages.dropped``), or ``{"stale": true}`` (it passes the checks and the row as
read decides: nothing changes). In every case the order stays as it was, nothing is
undone at a remote service and the message is handled once (tests/e2e/test_hostile_messages.py).

Values: ``"CURRENT_ETAG"`` is the order row's ETag now, ``"OTHER_ORDER"`` another real
order's id, ``{"repeat": "x", "count": n}`` a string of ``n`` characters.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from core.models import OrderState, ProcessState

HOSTILE_MESSAGES = Path(__file__).resolve().parent / "hostile_messages.json"
#: An ETag of Table Storage's form that no row has now (a fence from an earlier claim).
STALE_ETAG = "W/\"datetime'2026-01-01T00%3A00%3A00.0000000Z'\""
RESPONSES, NUDGES, INVENTORY_REQUESTS = "agent-responses", "scheduler", "inventory-requests"


def load_hostile_messages() -> list[dict]:
    return json.loads(HOSTILE_MESSAGES.read_text(encoding="utf-8"))


def base_messages(state: OrderState, document: str, now: datetime) -> dict[str, dict[str, Any]]:
    """The messages the app sends about an order, as JSON documents, from its state row:
    the response of its last line (refused), a nudge with its snapshot, and an agent
    request for its first step, each carrying the row as claimed with a stale ETag."""
    fence = state.model_copy(update={"process_state": ProcessState.PROCESSING, "etag": STALE_ETAG})
    claimed = json.loads(fence.model_dump_json())
    order = json.loads(document)
    response = {
        "order_id": state.order_id, "step": state.step, "kind": state.kind.value, "attempt": state.attempt,
        "outcome": "failed_permanent", "error": "refused by a forger",
        "context": {"fence": claimed, "order": order, "results": {}},
    }
    first = {**claimed, "step_index": 0, "step": "reserve", "kind": "action", "attempt": 1}
    request = {
        "order_id": state.order_id, "step": "reserve", "kind": "action", "action": "reserve", "remote": "inventory",
        "attempt": 1, "complete_by": (now - timedelta(hours=1)).isoformat(),  # past: no agent would call
        "idempotency_key": "forged", "policy": {"max_calls": 1, "backoff_initial": 0.1, "backoff_max": 0.1},
        "context": {"fence": first, "order": order, "results": {}},
    }
    nudge = {"order_id": state.order_id, "state": json.loads(state.model_copy(update={"etag": STALE_ETAG}).model_dump_json())}
    return {RESPONSES: response, NUDGES: nudge, INVENTORY_REQUESTS: request}


def hostile_body(case: dict, bases: dict[str, dict[str, Any]], *, current_etag: str, other_order: str) -> str:
    """The body of one case: its raw text, or its queue's base message with its edits."""
    if "raw" in case:
        return case["raw"]
    message = copy.deepcopy(bases[case["queue"]])
    for path, value in case.get("set", {}).items():
        *parents, leaf = path.split(".")
        target = message
        for part in parents:
            target = target[part]
        target[leaf] = _value(value, current_etag=current_etag, other_order=other_order)
    return json.dumps(message)


def _value(value: Any, *, current_etag: str, other_order: str) -> Any:
    if value == "CURRENT_ETAG":
        return current_etag
    if value == "OTHER_ORDER":
        return other_order
    if isinstance(value, dict) and set(value) == {"repeat", "count"}:
        return value["repeat"] * value["count"]
    if isinstance(value, dict):
        return {key: _value(item, current_etag=current_etag, other_order=other_order) for key, item in value.items()}
    return value
