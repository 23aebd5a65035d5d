"""Each fault kind, and scripts per order id and per order and action, for every service or one."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from tests.fake_remote.client import call, reserve, wait_until


def test_transient_is_503_and_not_applied(fake_remote):
    fake_remote.set_faults(script={"o-1": ["transient"]})
    response = reserve(fake_remote.url, "o-1", "k")

    assert response.status_code == 503
    assert response.json()["error"] == "transient"
    effects = fake_remote.effects()
    assert effects["total"] == 0
    assert effects["faults"]["transient"] == 1


def test_throttle_is_429_with_retry_after(fake_remote):
    fake_remote.set_faults(script={"o-1": ["throttle"], "o-2": ["throttle"]})
    default = reserve(fake_remote.url, "o-1", "k-1")
    fake_remote.set_faults(script={"o-2": ["throttle"]}, retry_after_seconds=7)
    configured = reserve(fake_remote.url, "o-2", "k-2")

    assert (default.status_code, default.headers["Retry-After"]) == (429, "1")
    assert (configured.status_code, configured.headers["Retry-After"]) == (429, "7")
    assert fake_remote.effects()["total"] == 0


def test_permanent_is_422_and_bad_request_is_400_neither_applied(fake_remote):
    fake_remote.set_faults(script={"o-1": ["permanent"], "o-2": ["bad_request"]})
    permanent = reserve(fake_remote.url, "o-1", "k-1")
    bad = reserve(fake_remote.url, "o-2", "k-2")

    assert permanent.status_code == 422
    assert permanent.json()["error"] == "permanent"
    assert bad.status_code == 400
    assert bad.json()["error"] == "bad_request"
    effects = fake_remote.effects()
    assert effects["total"] == 0
    assert (effects["faults"]["permanent"], effects["faults"]["bad_request"]) == (1, 1)


def test_drop_closes_the_connection_without_a_response(fake_remote):
    fake_remote.set_faults(script={"o-1": ["drop"]})
    with pytest.raises(requests.ConnectionError):
        reserve(fake_remote.url, "o-1", "k")

    assert fake_remote.effects()["total"] == 0
    assert fake_remote.effects()["faults"]["drop"] == 1
    assert reserve(fake_remote.url, "o-1", "k").status_code == 200  # script used up: success


def test_slow_applies_then_answers_late_and_a_retry_gets_the_first_result(fake_remote):
    fake_remote.set_faults(script={"o-1": ["slow"]}, slow_seconds=10)
    started = time.monotonic()
    with pytest.raises(requests.ReadTimeout):
        reserve(fake_remote.url, "o-1", "k", timeout=0.3)

    # The effect happened although the client saw no response.
    assert fake_remote.effects()["by_key"] == {"k": 1}
    # The server notices the client left and frees the call long before slow_seconds.
    wait_until(lambda: fake_remote.effects()["in_flight"] == 0, timeout=3, what="the slow call to end")
    assert time.monotonic() - started < 5

    retry = reserve(fake_remote.url, "o-1", "k", attempt=2)
    assert retry.status_code == 200
    assert retry.headers["Idempotent-Replayed"] == "true"
    effects = fake_remote.effects()
    assert effects["total"] == 1
    assert effects["faults"]["slow"] == 1


def test_slow_answers_200_to_a_client_that_waits(fake_remote):
    fake_remote.set_faults(script={"o-1": ["slow"]}, slow_seconds=0.3)
    started = time.monotonic()
    response = reserve(fake_remote.url, "o-1", "k", timeout=5)

    assert response.status_code == 200
    assert time.monotonic() - started >= 0.3
    assert fake_remote.effects()["total"] == 1


def test_hang_does_not_apply_when_the_client_gives_up(fake_remote):
    fake_remote.set_faults(script={"o-1": ["hang"]}, slow_seconds=1.5)
    with pytest.raises(requests.ReadTimeout):
        reserve(fake_remote.url, "o-1", "k", timeout=0.2)

    wait_until(lambda: fake_remote.effects()["in_flight"] == 0, timeout=5, what="the hanging call to end")
    effects = fake_remote.effects()
    assert effects["total"] == 0
    assert effects["faults"]["hang"] == 1


def test_hang_applies_when_the_client_waits_it_out(fake_remote):
    fake_remote.set_faults(script={"o-1": ["hang"]}, slow_seconds=0.3)
    started = time.monotonic()
    response = reserve(fake_remote.url, "o-1", "k", timeout=5)

    assert response.status_code == 200
    assert time.monotonic() - started >= 0.3
    assert fake_remote.effects()["total"] == 1


def test_hang_then_a_same_key_retry_applies_once(fake_remote):
    # The hanging first call waits it out; meanwhile a retry with the same key applies.
    # When the hang ends it must return that result, not apply a second time.
    fake_remote.set_faults(script={"o-1": ["hang"]}, slow_seconds=0.5)
    results = {}
    first = threading.Thread(target=lambda: results.update(first=reserve(fake_remote.url, "o-1", "k", timeout=5)))
    first.start()
    wait_until(lambda: fake_remote.effects()["faults"]["hang"] == 1, what="the first call to hang")
    second = reserve(fake_remote.url, "o-1", "k", attempt=2)
    first.join(timeout=5)

    assert second.status_code == 200
    assert results["first"].status_code == 200
    assert results["first"].content == second.content
    assert fake_remote.effects()["by_key"] == {"k": 1}


def test_script_is_consumed_per_order_then_success(fake_remote):
    fake_remote.set_faults(script={"o-1": ["transient", "transient"], "o-2": ["permanent"]})
    with requests.Session() as session:
        one = [reserve(fake_remote.url, "o-1", "k-1", session=session).status_code for _ in range(4)]
        two = reserve(fake_remote.url, "o-2", "k-2", session=session).status_code
        other = reserve(fake_remote.url, "o-3", "k-3", session=session).status_code

    assert one == [503, 503, 200, 200]
    assert two == 422
    assert other == 200
    assert fake_remote.effects()["by_order"] == {"o-1": 1, "o-3": 1}


def test_script_counts_calls_per_order_across_keys(fake_remote):
    fake_remote.set_faults(script={"o-1": ["ok", "permanent"]})
    assert reserve(fake_remote.url, "o-1", "step-1-key", step="one").status_code == 200
    assert reserve(fake_remote.url, "o-1", "step-2-key", step="two").status_code == 422
    assert fake_remote.effects()["by_order"] == {"o-1": 1}


def test_script_always_repeats_its_fault(fake_remote):
    fake_remote.set_faults(script={"o-1": ["throttle", "always:transient"]})
    with requests.Session() as session:
        statuses = [reserve(fake_remote.url, "o-1", "k", session=session).status_code for _ in range(6)]

    assert statuses == [429] + [503] * 5
    assert fake_remote.effects()["total"] == 0


def test_script_always_drop_keeps_dropping(fake_remote):
    fake_remote.set_faults(script={"o-1": ["always:drop"]})
    for _ in range(3):
        with pytest.raises(requests.ConnectionError):
            reserve(fake_remote.url, "o-1", "k")
    assert fake_remote.effects()["faults"]["drop"] == 3


# --- per service and per action ------------------------------------------------------


def test_faults_set_for_one_service_leave_the_others_alone(fake_remote):
    fake_remote.set_faults(service="payments", script={"o-1": ["transient"]}, rates={"throttle": 1.0})
    with requests.Session() as session:
        reserved = reserve(fake_remote.url, "o-1", "k-reserve", session=session).status_code
        charges = [call(fake_remote.url, "o-1", "k-charge", service="payments", action="charge", session=session).status_code
                   for _ in range(2)]  # fmt: skip
        other = call(fake_remote.url, "o-2", "k-charge-2", service="payments", action="charge", session=session)

    assert reserved == 200
    assert charges == [503, 200]  # the script governs o-1: no rates
    assert other.status_code == 429
    effects = fake_remote.effects()
    assert effects["services"]["payments"]["faults"]["transient"] == 1
    assert effects["services"]["inventory"]["faults"] == {kind: 0 for kind in effects["faults"]}


def test_faults_for_every_service_give_each_its_own_copy_of_the_script(fake_remote):
    fake_remote.set_faults(script={"o-1": ["transient"]})
    with requests.Session() as session:
        statuses = {
            service: [call(fake_remote.url, "o-1", f"k-{action}", service=service, action=action, session=session)
                      .status_code for _ in range(2)]
            for service, action in [("inventory", "reserve"), ("payments", "charge"), ("shipping", "ship")]
        }  # fmt: skip

    assert statuses == {"inventory": [503, 200], "payments": [503, 200], "shipping": [503, 200]}


def test_a_later_set_faults_for_every_service_replaces_the_per_service_ones(fake_remote):
    fake_remote.set_faults(service="payments", rates={"transient": 1.0})
    fake_remote.set_faults(rates={"throttle": 1.0})
    assert fake_remote.config("payments")["rates"] == {"throttle": 1.0}
    fake_remote.set_faults()
    assert all(c["rates"] == {} and c["script"] == {} for c in fake_remote.config()["services"].values())


def test_a_per_action_script_fails_only_that_action(fake_remote):
    fake_remote.set_faults(script={"o-1/release": ["transient"] * 50})
    with requests.Session() as session:
        reserved = reserve(fake_remote.url, "o-1", "k-reserve", session=session)
        releases = [call(fake_remote.url, "o-1", "k-release", action="release", session=session).status_code
                    for _ in range(5)]  # fmt: skip
        other_order = call(fake_remote.url, "o-2", "k-release-2", action="release", session=session)

    assert reserved.status_code == 200
    assert releases == [503] * 5
    assert other_order.status_code == 200
    assert fake_remote.net("o-1") == {"inventory": {"reserve": 1}}
    # Only inventory has a release: the other services got no copy of that entry.
    assert fake_remote.config("inventory")["script_remaining"] == {"o-1/release": ["transient"] * 45}
    assert fake_remote.config("payments")["script"] == {}


def test_a_per_action_script_takes_precedence_over_the_orders_script(fake_remote):
    fake_remote.set_faults(script={"o-1": ["permanent"], "o-1/release": ["transient", "ok"]})
    with requests.Session() as session:
        reserved = reserve(fake_remote.url, "o-1", "k-reserve", session=session).status_code
        releases = [call(fake_remote.url, "o-1", "k-release", action="release", session=session).status_code
                    for _ in range(3)]  # fmt: skip

    assert reserved == 422  # the order's script
    assert releases == [503, 200, 200]  # its own script, used up: success, whatever the order's script says
    assert fake_remote.config("inventory")["script_remaining"] == {"o-1": [], "o-1/release": []}


def test_a_per_action_script_for_one_service(fake_remote):
    fake_remote.set_faults(service="payments", script={"o-1/refund": ["always:throttle"]}, retry_after_seconds=2)
    charge = call(fake_remote.url, "o-1", "k-charge", service="payments", action="charge")
    refund = call(fake_remote.url, "o-1", "k-refund", service="payments", action="refund", result=charge.json())

    assert charge.status_code == 200
    assert (refund.status_code, refund.headers["Retry-After"]) == (429, "2")
    assert fake_remote.net("o-1") == {"payments": {"charge": 1}}


def test_slow_and_hang_settings_are_per_service(fake_remote):
    fake_remote.set_faults(service="shipping", script={"o-1": ["slow"]}, slow_seconds=0.3)
    fake_remote.set_faults(service="inventory", script={"o-1": ["hang"]}, slow_seconds=10)
    started = time.monotonic()
    shipped = call(fake_remote.url, "o-1", "k-ship", service="shipping", action="ship", timeout=5)
    assert shipped.status_code == 200
    assert 0.3 <= time.monotonic() - started < 5
    with pytest.raises(requests.ReadTimeout):
        reserve(fake_remote.url, "o-1", "k-reserve", timeout=0.3)
    wait_until(lambda: fake_remote.effects()["in_flight"] == 0, timeout=3, what="the hanging call to end")
    assert fake_remote.effects()["by_order"] == {"o-1": 1}
