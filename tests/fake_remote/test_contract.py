"""The remote service contract without faults: success body, idempotency, validation, routing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import requests

from devtools.fake_remote import DEFAULT_SERVICES, confirmation_for
from tests.fake_remote.client import call, complete_by_header, reserve


def test_success_returns_the_documented_body(fake_remote):
    response = reserve(fake_remote.url, "o-1", "key-1", attempt=3)

    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"order_id", "step", "service", "action", "kind", "confirmation", "applied_at"}
    assert (body["order_id"], body["step"], body["service"], body["action"], body["kind"]) == (
        "o-1", "reserve", "inventory", "reserve", "action",
    )  # fmt: skip
    assert body["confirmation"] == confirmation_for("key-1")
    assert datetime.fromisoformat(body["applied_at"]).tzinfo is not None
    assert response.headers["Idempotent-Replayed"] == "false"
    effects = fake_remote.effects()
    assert effects["by_key"] == {"key-1": 1}
    assert effects["by_order"] == {"o-1": 1}
    assert (effects["total"], effects["calls"]) == (1, 1)
    assert effects["services"]["inventory"]["applied"] == {"o-1": ["reserve"]}


def test_repeat_with_same_key_returns_first_result_and_applies_once(fake_remote):
    first = reserve(fake_remote.url, "o-1", "key-1", attempt=1)
    again = [reserve(fake_remote.url, "o-1", "key-1", attempt=attempt, order={"retry": attempt}) for attempt in (2, 3)]

    assert [r.status_code for r in again] == [200, 200]
    assert all(r.content == first.content for r in again)  # byte for byte, applied_at included
    assert [r.headers["Idempotent-Replayed"] for r in again] == ["true", "true"]
    effects = fake_remote.effects()
    assert effects["by_key"] == {"key-1": 1}
    assert effects["total"] == 1
    assert effects["calls"] == 3
    assert effects["replays"] == 2
    assert effects["twice"] == 0


def test_effects_are_counted_per_key_and_per_order(fake_remote):
    with requests.Session() as session:
        for order_id, key in [("o-1", "a"), ("o-1", "b"), ("o-2", "c"), ("o-1", "a")]:
            assert reserve(fake_remote.url, order_id, key, step=key, session=session).status_code == 200

    effects = fake_remote.effects()
    assert effects["by_key"] == {"a": 1, "b": 1, "c": 1}
    assert effects["by_order"] == {"o-1": 2, "o-2": 1}
    assert effects["total"] == 3


def test_confirmation_is_stable_per_key_and_differs_between_keys(fake_remote):
    one = reserve(fake_remote.url, "o-1", "k-1").json()["confirmation"]
    two = reserve(fake_remote.url, "o-2", "k-2").json()["confirmation"]
    fake_remote.reset()
    assert reserve(fake_remote.url, "o-1", "k-1").json()["confirmation"] == one
    assert one != two


def test_three_services_on_one_server(fake_remote):
    assert fake_remote.services == {
        "inventory": {"reserve": "release"},
        "payments": {"charge": "refund"},
        "shipping": {"ship": None},
    }
    assert fake_remote.base_url("payments") == f"{fake_remote.url}/payments"
    assert fake_remote.app_settings() == {
        f"REMOTE_{name.upper()}_URL": f"{fake_remote.url}/{name}" for name in ("inventory", "payments", "shipping")
    }
    with pytest.raises(KeyError):
        fake_remote.base_url("billing")

    with requests.Session() as session:
        for service, action in [("inventory", "reserve"), ("payments", "charge"), ("shipping", "ship")]:
            response = call(fake_remote.url, "o-1", f"o-1/{action}", service=service, action=action, session=session)
            assert response.status_code == 200
            assert (response.json()["service"], response.json()["action"]) == (service, action)

    effects = fake_remote.effects()
    assert (effects["total"], effects["by_order"], effects["twice"]) == (3, {"o-1": 3}, 0)
    assert {name: s["applied"] for name, s in effects["services"].items()} == {
        "inventory": {"o-1": ["reserve"]},
        "payments": {"o-1": ["charge"]},
        "shipping": {"o-1": ["ship"]},
    }
    assert all(s["undone"] == {} and s["calls"] == 1 for s in effects["services"].values())
    assert effects["net"] == {"o-1": {"inventory": {"reserve": 1}, "payments": {"charge": 1}, "shipping": {"ship": 1}}}
    assert fake_remote.net("o-1") == effects["net"]["o-1"]
    assert fake_remote.net("o-9") == {}


def test_the_default_services_serve_the_current_workflow():
    # Adding a step at a new service or a new action: teach devtools/fake_remote/catalog.py.
    from core.workflow import CURRENT

    for step in CURRENT.steps:
        assert DEFAULT_SERVICES.get(step.remote, {}).get(step.action, "missing") == step.compensate, (
            f"the fake's DEFAULT_SERVICES lacks {step.remote}/{step.action} -> {step.compensate}"
        )


def test_keys_are_scoped_per_service(fake_remote):
    # Two services are two services: the same key string at each applies at each.
    assert reserve(fake_remote.url, "o-1", "same").status_code == 200
    charged = call(fake_remote.url, "o-1", "same", service="payments", action="charge")
    assert (charged.status_code, charged.headers["Idempotent-Replayed"]) == (200, "false")
    assert fake_remote.effects()["by_order"] == {"o-1": 2}


def test_services_are_configurable_at_start():
    from devtools.fake_remote import start

    with start(port=0, services={"billing": {"invoice": "void", "notify": None}}) as svc:
        assert svc.services == {"billing": {"invoice": "void", "notify": None}}
        assert call(svc.url, "o-1", "k-1", service="billing", action="invoice").status_code == 200
        void = call(svc.url, "o-1", "k-2", service="billing", action="void", step="invoice", kind="compensation")
        assert void.json()["outcome"] == "undone"
        assert call(svc.url, "o-1", "k-3", service="inventory", action="reserve").status_code == 404
        assert svc.net("o-1") == {"billing": {"invoice": 0}}


def test_missing_idempotency_key_is_400_with_json_error(fake_remote):
    response = reserve(fake_remote.url, "o-1", None)

    assert response.status_code == 400
    assert response.json()["error"] == "missing_idempotency_key"
    effects = fake_remote.effects()
    assert effects["total"] == 0
    assert effects["invalid"] == 1


def test_blank_idempotency_key_is_400(fake_remote):
    assert reserve(fake_remote.url, "o-1", "").status_code == 400
    assert fake_remote.effects()["total"] == 0


@pytest.mark.parametrize("complete_by", [None, "", "tomorrow", "2026-11-23T10:15:30", "2026-11-23", "2026-13-40T10:15:30Z"])
def test_missing_or_unparsable_complete_by_is_400_and_not_applied(fake_remote, complete_by):
    response = reserve(fake_remote.url, "o-1", "k", complete_by=complete_by)

    assert response.status_code == 400
    assert response.json()["error"] == ("missing_complete_by" if not complete_by else "invalid_complete_by")
    effects = fake_remote.effects()
    assert (effects["total"], effects["invalid"]) == (0, 1)


@pytest.mark.parametrize(
    "complete_by",
    ["2026-11-23T10:15:30.123Z", "2026-11-23T10:15:30Z", "2026-11-23T11:15:30.5+01:00", "2026-11-23 10:15:30z"],
)
def test_rfc3339_complete_by_forms_are_accepted(fake_remote, complete_by):
    # These are all in the past, hence late: accepted and served all the same.
    assert reserve(fake_remote.url, "o-1", "k", complete_by=complete_by).status_code == 200


def test_invalid_bodies_are_400_and_not_applied(fake_remote):
    url = f"{fake_remote.url}/inventory/reserve"
    headers = {"Idempotency-Key": "k", "Complete-By": complete_by_header(datetime.now(UTC) + timedelta(minutes=1))}
    good = {"order_id": "o-1", "step": "reserve", "attempt": 1, "order": {}, "kind": "action"}
    bad = [
        requests.post(url, data=b"{not json", headers=headers, timeout=5),
        requests.post(url, json=["a list"], headers=headers, timeout=5),
        requests.post(url, json={k: v for k, v in good.items() if k != "order"}, headers=headers, timeout=5),
        requests.post(url, json={k: v for k, v in good.items() if k != "kind"}, headers=headers, timeout=5),
        requests.post(url, json={**good, "order_id": ""}, headers=headers, timeout=5),
        requests.post(url, json={**good, "attempt": "1"}, headers=headers, timeout=5),
        requests.post(url, json={**good, "kind": "undo"}, headers=headers, timeout=5),
    ]
    assert [r.status_code for r in bad] == [400] * 7
    assert all("error" in r.json() for r in bad)
    assert fake_remote.effects()["total"] == 0


def test_kind_must_match_the_route(fake_remote):
    as_compensation = reserve(fake_remote.url, "o-1", "k-1", kind="compensation", result=None)
    as_action = call(fake_remote.url, "o-1", "k-2", action="release", kind="action")

    assert (as_compensation.status_code, as_action.status_code) == (400, 400)
    assert "forward action" in as_compensation.json()["message"]
    assert "compensation" in as_action.json()["message"]
    assert fake_remote.effects()["by_key"] == {}


def test_a_compensation_must_carry_a_result_object_or_null(fake_remote):
    null = call(fake_remote.url, "o-1", "k-1", action="release", result=None)
    assert null.status_code == 200  # null is fine: the forward outcome was unknown

    url = f"{fake_remote.url}/inventory/release"
    headers = {"Idempotency-Key": "k-2", "Complete-By": complete_by_header(datetime.now(UTC) + timedelta(minutes=1))}
    body = {"order_id": "o-2", "step": "reserve", "attempt": 1, "order": {}, "kind": "compensation"}
    assert requests.post(url, json=body, headers=headers, timeout=5).status_code == 400
    assert requests.post(url, json={**body, "result": "x"}, headers=headers, timeout=5).status_code == 400


def test_key_reused_for_another_order_is_rejected_without_effect(fake_remote):
    assert reserve(fake_remote.url, "o-1", "shared").status_code == 200
    other = reserve(fake_remote.url, "o-2", "shared")

    assert other.status_code == 422
    assert other.json()["error"] == "idempotency_key_reused"
    assert fake_remote.effects()["by_order"] == {"o-1": 1}


def test_unknown_service_or_action_is_404(fake_remote):
    unknown_service = call(fake_remote.url, "o-1", "k", service="billing", action="reserve")
    unknown_action = call(fake_remote.url, "o-1", "k", service="inventory", action="charge")
    no_action = requests.post(f"{fake_remote.url}/inventory", json={}, timeout=5)
    too_deep = requests.post(f"{fake_remote.url}/inventory/reserve/now", json={}, timeout=5)

    assert (unknown_service.status_code, unknown_service.json()["error"]) == (404, "unknown_service")
    assert (unknown_action.status_code, unknown_action.json()["error"]) == (404, "unknown_action")
    assert "reserve" in unknown_action.json()["message"]  # says what the service has
    assert (no_action.status_code, too_deep.status_code) == (404, 404)
    effects = fake_remote.effects()
    assert (effects["total"], effects["calls"], effects["not_found"]) == (0, 0, 4)


def test_the_old_fulfil_route_is_gone(fake_remote):
    assert requests.post(f"{fake_remote.url}/fulfil", json={}, timeout=5).status_code == 404


def test_unknown_path_and_wrong_method(fake_remote):
    assert requests.get(f"{fake_remote.url}/nope", timeout=5).status_code == 404
    wrong = requests.get(f"{fake_remote.url}/inventory/reserve", timeout=5)
    assert wrong.status_code == 405
    assert wrong.json()["error"] == "method_not_allowed"


def test_keep_alive_session_serves_many_calls_on_one_connection(fake_remote):
    with requests.Session() as session:
        statuses = [reserve(fake_remote.url, f"o-{i}", f"k-{i}", session=session).status_code for i in range(50)]
    assert statuses == [200] * 50
    assert fake_remote.effects()["total"] == 50


def test_a_lookup_by_idempotency_key_answers_the_first_result_or_404(fake_remote):
    import requests as http

    from tests.fake_remote.client import reserve

    first = reserve(fake_remote.url, "o-1", "k-1")
    assert first.status_code == 200
    found = http.get(f"{fake_remote.url}/inventory/reserve/k-1", timeout=5)
    assert found.status_code == 200 and found.json() == first.json()
    assert http.get(f"{fake_remote.url}/inventory/reserve/k-2", timeout=5).status_code == 404
    assert http.get(f"{fake_remote.url}/inventory/release/k-1", timeout=5).status_code == 404  # another action
    assert http.get(f"{fake_remote.url}/shipping/ship/k-1", timeout=5).status_code == 405  # shipping offers none
    assert fake_remote.effects()["services"]["inventory"]["lookups"] == 3


def test_each_calls_traceparent_is_kept_per_order(fake_remote):
    first, second = (f"00-{n * 32}-{n * 16}-01" for n in ("a", "b"))
    reserve(fake_remote.url, "o-1", "key-1", headers={"traceparent": first})
    call(fake_remote.url, "o-1", "key-2", service="payments", action="charge", headers={"traceparent": second})
    reserve(fake_remote.url, "o-1", "key-1")  # a caller that sends none
    fake_remote.set_faults(script={"o-2": ["permanent"]})
    assert reserve(fake_remote.url, "o-2", "key-3", headers={"traceparent": second}).status_code == 422

    # Every call that named its order, as it arrived: refused ones too.
    assert fake_remote.traceparents("o-1") == [
        {"service": "inventory", "action": "reserve", "key": "key-1", "traceparent": first},
        {"service": "inventory", "action": "reserve", "key": "key-1", "traceparent": None},
        {"service": "payments", "action": "charge", "key": "key-2", "traceparent": second},
    ]
    inventory = fake_remote.effects()["services"]["inventory"]["traceparents"]
    assert inventory["o-2"] == [{"action": "reserve", "key": "key-3", "traceparent": second}]
    assert fake_remote.traceparents("o-3") == []
    fake_remote.reset()
    assert fake_remote.effects()["traceparents"] == {}
