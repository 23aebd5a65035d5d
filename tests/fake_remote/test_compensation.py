"""Compensations: undo an applied action once, no-op when nothing was applied; the
effects a workflow's end-to-end tests check (Processed vs Compensated orders)."""

from __future__ import annotations

import requests

from tests.fake_remote.client import call, reserve

WORKFLOW = [("inventory", "reserve", "release"), ("payments", "charge", "refund"), ("shipping", "ship", None)]


def _key(order_id: str, step: str, action: str) -> str:
    return f"{order_id}/{step}/{action}"  # stable per order, step and action, as the app's


def test_a_compensation_undoes_the_applied_action_once(fake_remote):
    forward = reserve(fake_remote.url, "o-1", _key("o-1", "reserve", "reserve"))
    release = call(fake_remote.url, "o-1", _key("o-1", "reserve", "release"), action="release", result=forward.json())
    again = call(fake_remote.url, "o-1", _key("o-1", "reserve", "release"), action="release", result=forward.json(), attempt=2)

    assert release.status_code == 200
    body = release.json()
    assert (body["kind"], body["action"], body["undone"], body["undid"], body["outcome"]) == (
        "compensation", "release", True, "reserve", "undone",
    )  # fmt: skip
    assert again.content == release.content
    assert again.headers["Idempotent-Replayed"] == "true"
    effects = fake_remote.effects()
    inventory = effects["services"]["inventory"]
    assert inventory["applied"] == {"o-1": ["reserve"]}
    assert inventory["undone"] == {"o-1": ["release"]}
    assert (inventory["noop_compensations"], inventory["twice"]) == (0, 0)
    assert effects["net"] == {"o-1": {"inventory": {"reserve": 0}}}
    assert (effects["total"], effects["by_order"], effects["undos"]) == (1, {"o-1": 1}, 1)


def test_a_compensation_of_an_action_never_applied_is_a_2xx_no_op(fake_remote):
    refund = call(fake_remote.url, "o-1", "k-refund", service="payments", action="refund", result=None)
    replay = call(fake_remote.url, "o-1", "k-refund", service="payments", action="refund", result=None)

    assert refund.status_code == 200
    body = refund.json()
    assert (body["undone"], body["undid"], body["outcome"]) == (False, None, "nothing_to_undo")
    assert "nothing to undo" in body["message"]
    assert replay.content == refund.content
    effects = fake_remote.effects()
    payments = effects["services"]["payments"]
    assert (payments["noop_compensations"], payments["applied"], payments["undone"]) == (1, {}, {})
    assert (effects["noop_compensations"], effects["undos"], effects["net"]) == (1, 0, {})


def test_the_forward_action_retried_after_its_compensation_is_a_replay_not_a_new_effect(fake_remote):
    assert reserve(fake_remote.url, "o-1", "k-reserve").status_code == 200
    assert call(fake_remote.url, "o-1", "k-release", action="release").json()["undone"] is True
    late_retry = reserve(fake_remote.url, "o-1", "k-reserve", attempt=2)

    assert late_retry.headers["Idempotent-Replayed"] == "true"
    assert fake_remote.net("o-1") == {"inventory": {"reserve": 0}}


def test_a_second_compensation_key_for_an_undone_step_undoes_nothing_and_counts_twice(fake_remote):
    reserve(fake_remote.url, "o-1", "k-reserve")
    call(fake_remote.url, "o-1", "k-release", action="release")
    second = call(fake_remote.url, "o-1", "k-release-again", action="release")

    assert second.status_code == 200
    assert (second.json()["undone"], second.json()["outcome"]) == (False, "already_undone")
    inventory = fake_remote.effects()["services"]["inventory"]
    assert inventory["undone"] == {"o-1": ["release"]}
    assert (inventory["twice"], inventory["noop_compensations"]) == (1, 0)


def test_a_forward_action_applied_under_a_second_key_counts_twice(fake_remote):
    # What an app whose idempotency key is not stable would do: the effect happens twice.
    reserve(fake_remote.url, "o-1", "k-1")
    reserve(fake_remote.url, "o-1", "k-2")

    effects = fake_remote.effects()
    assert effects["services"]["inventory"]["applied"] == {"o-1": ["reserve", "reserve"]}
    assert (effects["twice"], effects["by_order"], fake_remote.net("o-1")) == (1, {"o-1": 2}, {"inventory": {"reserve": 2}})


def test_processed_and_compensated_orders_as_a_workflow_test_checks_them(fake_remote):
    # o-ok: every step done. o-comp: charge refused for good, so reserve is released and
    # the charge's compensation is sent too (its outcome unknown to the caller): a no-op.
    fake_remote.set_faults(service="payments", script={"o-comp/charge": ["always:permanent"]})
    with requests.Session() as session:
        for service, action, _ in WORKFLOW:
            assert call(fake_remote.url, "o-ok", _key("o-ok", action, action), service=service, action=action,
                        session=session).status_code == 200  # fmt: skip
        reserved = call(fake_remote.url, "o-comp", _key("o-comp", "reserve", "reserve"), session=session)
        charge = call(fake_remote.url, "o-comp", _key("o-comp", "charge", "charge"), service="payments", action="charge",
                      session=session)  # fmt: skip
        assert charge.status_code == 422
        for service, action, compensation in reversed(WORKFLOW[:2]):
            result = reserved.json() if action == "reserve" else None
            response = call(fake_remote.url, "o-comp", _key("o-comp", action, compensation), service=service,
                            action=compensation, result=result, session=session)  # fmt: skip
            assert response.status_code == 200

    effects = fake_remote.effects()
    services = effects["services"]
    # Processed: every action applied once, nothing undone.
    for service, action, _ in WORKFLOW:
        assert services[service]["applied"]["o-ok"] == [action]
        assert "o-ok" not in services[service]["undone"]
    assert effects["net"]["o-ok"] == {"inventory": {"reserve": 1}, "payments": {"charge": 1}, "shipping": {"ship": 1}}
    # Compensated: every applied action undone once, so nothing stays applied.
    assert services["inventory"]["applied"]["o-comp"] == ["reserve"]
    assert services["inventory"]["undone"]["o-comp"] == ["release"]
    assert "o-comp" not in services["payments"]["applied"]
    assert services["payments"]["noop_compensations"] == 1
    assert all(n == 0 for by_action in effects["net"]["o-comp"].values() for n in by_action.values())
    # No key applied twice, no call after its complete-by.
    assert (effects["twice"], effects["late"]) == (0, 0)
