"""The /fulfil contract without faults: success body, idempotency, validation."""

from __future__ import annotations

from datetime import datetime

import requests

from devtools.fake_remote import confirmation_for
from tests.fake_remote.client import fulfil


def test_success_returns_the_documented_body(fake_remote):
    response = fulfil(fake_remote.url, "o-1", "key-1", step="fulfil", attempt=3)

    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"order_id", "step", "confirmation", "applied_at"}
    assert body["order_id"] == "o-1"
    assert body["step"] == "fulfil"
    assert body["confirmation"] == confirmation_for("key-1")
    assert datetime.fromisoformat(body["applied_at"]).tzinfo is not None
    assert response.headers["Idempotent-Replayed"] == "false"
    effects = fake_remote.effects()
    assert effects["by_key"] == {"key-1": 1}
    assert effects["by_order"] == {"o-1": 1}
    assert (effects["total"], effects["calls"]) == (1, 1)


def test_repeat_with_same_key_returns_first_result_and_applies_once(fake_remote):
    first = fulfil(fake_remote.url, "o-1", "key-1", attempt=1)
    again = [fulfil(fake_remote.url, "o-1", "key-1", attempt=attempt, payload={"retry": attempt}) for attempt in (2, 3)]

    assert [r.status_code for r in again] == [200, 200]
    assert all(r.content == first.content for r in again)  # byte for byte, applied_at included
    assert [r.headers["Idempotent-Replayed"] for r in again] == ["true", "true"]
    effects = fake_remote.effects()
    assert effects["by_key"] == {"key-1": 1}
    assert effects["total"] == 1
    assert effects["calls"] == 3
    assert effects["replays"] == 2


def test_effects_are_counted_per_key_and_per_order(fake_remote):
    with requests.Session() as session:
        for order_id, key in [("o-1", "a"), ("o-1", "b"), ("o-2", "c"), ("o-1", "a")]:
            assert fulfil(fake_remote.url, order_id, key, step=key, session=session).status_code == 200

    effects = fake_remote.effects()
    assert effects["by_key"] == {"a": 1, "b": 1, "c": 1}
    assert effects["by_order"] == {"o-1": 2, "o-2": 1}
    assert effects["total"] == 3


def test_confirmation_is_stable_per_key_and_differs_between_keys(fake_remote):
    one = fulfil(fake_remote.url, "o-1", "k-1").json()["confirmation"]
    two = fulfil(fake_remote.url, "o-2", "k-2").json()["confirmation"]
    fake_remote.reset()
    assert fulfil(fake_remote.url, "o-1", "k-1").json()["confirmation"] == one
    assert one != two


def test_missing_idempotency_key_is_400_with_json_error(fake_remote):
    response = fulfil(fake_remote.url, "o-1", None)

    assert response.status_code == 400
    assert response.json()["error"] == "missing_idempotency_key"
    effects = fake_remote.effects()
    assert effects["total"] == 0
    assert effects["invalid"] == 1


def test_blank_idempotency_key_is_400(fake_remote):
    assert fulfil(fake_remote.url, "o-1", "").status_code == 400
    assert fake_remote.effects()["total"] == 0


def test_invalid_bodies_are_400_and_not_applied(fake_remote):
    url = f"{fake_remote.url}/fulfil"
    headers = {"Idempotency-Key": "k"}
    bad = [
        requests.post(url, data=b"{not json", headers=headers, timeout=5),
        requests.post(url, json=["a list"], headers=headers, timeout=5),
        requests.post(url, json={"order_id": "o-1", "step": "s", "attempt": 1}, headers=headers, timeout=5),
        requests.post(url, json={"order_id": "", "step": "s", "attempt": 1, "payload": {}}, headers=headers, timeout=5),
        requests.post(url, json={"order_id": "o", "step": "s", "attempt": "1", "payload": {}}, headers=headers, timeout=5),
    ]
    assert [r.status_code for r in bad] == [400] * 5
    assert all("error" in r.json() for r in bad)
    assert fake_remote.effects()["total"] == 0


def test_key_reused_for_another_order_is_rejected_without_effect(fake_remote):
    assert fulfil(fake_remote.url, "o-1", "shared").status_code == 200
    other = fulfil(fake_remote.url, "o-2", "shared")

    assert other.status_code == 422
    assert other.json()["error"] == "idempotency_key_reused"
    assert fake_remote.effects()["by_order"] == {"o-1": 1}


def test_unknown_path_and_wrong_method(fake_remote):
    assert requests.get(f"{fake_remote.url}/nope", timeout=5).status_code == 404
    wrong = requests.get(f"{fake_remote.url}/fulfil", timeout=5)
    assert wrong.status_code == 405
    assert wrong.json()["error"] == "method_not_allowed"


def test_keep_alive_session_serves_many_calls_on_one_connection(fake_remote):
    with requests.Session() as session:
        statuses = [fulfil(fake_remote.url, f"o-{i}", f"k-{i}", session=session).status_code for i in range(50)]
    assert statuses == [200] * 50
    assert fake_remote.effects()["total"] == 50
