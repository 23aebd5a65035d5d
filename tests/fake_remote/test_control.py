"""The control API over HTTP and its Python twin."""

from __future__ import annotations

import pytest
import requests

from devtools.fake_remote import FAULT_KINDS, FaultConfigError, start
from tests.fake_remote.client import call, reserve, wait_until


def test_health_lists_the_services(fake_remote):
    response = requests.get(f"{fake_remote.url}/_control/health", timeout=5)
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "services": fake_remote.services}


def test_effects_over_http_equal_the_python_api(fake_remote):
    fake_remote.set_faults(script={"o-2": ["transient"]})
    reserve(fake_remote.url, "o-1", "k-1")
    reserve(fake_remote.url, "o-1", "k-1")
    reserve(fake_remote.url, "o-2", "k-2")

    # in_flight drops just after the response is sent: let the last call finish.
    wait_until(lambda: fake_remote.effects()["in_flight"] == 0, what="calls to finish")
    over_http = requests.get(f"{fake_remote.url}/_control/effects", timeout=5).json()
    assert over_http == fake_remote.effects()
    assert over_http["by_key"] == {"k-1": 1}
    assert over_http["by_order"] == {"o-1": 1}
    assert over_http["total"] == 1
    assert over_http["calls"] == 3
    assert over_http["faults"] == {kind: (1 if kind == "transient" else 0) for kind in FAULT_KINDS}


def test_set_faults_over_http_replaces_script_and_rates(fake_remote):
    url = f"{fake_remote.url}/_control/faults"
    first = requests.post(url, json={"script": {"o-1": ["permanent"]}, "rates": {"transient": 1.0}}, timeout=5)
    assert first.status_code == 200
    assert set(first.json()["services"]) == {"inventory", "payments", "shipping"}
    assert all(c["script"] == {"o-1": ["permanent"]} for c in first.json()["services"].values())
    assert reserve(fake_remote.url, "o-1", "k-1").status_code == 422
    assert reserve(fake_remote.url, "o-9", "k-9").status_code == 503

    second = requests.post(url, json={"script": {"o-2": ["throttle"]}, "retry_after_seconds": 3}, timeout=5)
    assert second.status_code == 200
    config = requests.get(url, timeout=5).json()["services"]["inventory"]
    assert config["script"] == {"o-2": ["throttle"]}
    assert config["rates"] == {}  # replaced: omitted means none
    assert config["retry_after_seconds"] == 3
    assert reserve(fake_remote.url, "o-1", "k-1").status_code == 200
    throttled = reserve(fake_remote.url, "o-2", "k-2")
    assert (throttled.status_code, throttled.headers["Retry-After"]) == (429, "3")


def test_set_faults_over_http_for_one_service(fake_remote):
    url = f"{fake_remote.url}/_control/faults"
    response = requests.post(url, json={"service": "payments", "rates": {"transient": 1.0}, "slow_seconds": 2}, timeout=5)

    assert response.status_code == 200
    assert response.json() == fake_remote.config("payments")  # the service's configuration
    assert response.json()["actions"] == {"charge": "refund"}
    assert (response.json()["rates"], response.json()["slow_seconds"]) == ({"transient": 1.0}, 2)
    assert requests.get(url, params={"service": "payments"}, timeout=5).json() == response.json()
    assert requests.get(url, params={"service": "billing"}, timeout=5).status_code == 404
    assert requests.get(url, timeout=5).json() == fake_remote.config()
    assert fake_remote.config("inventory")["slow_seconds"] == 30  # the others are unchanged
    assert reserve(fake_remote.url, "o-1", "k-1").status_code == 200
    assert call(fake_remote.url, "o-1", "k-2", service="payments", action="charge").status_code == 503


def test_empty_faults_body_clears_faults(fake_remote):
    fake_remote.set_faults(rates={"transient": 1.0})
    assert requests.post(f"{fake_remote.url}/_control/faults", timeout=5).status_code == 200
    assert reserve(fake_remote.url, "o-1", "k").status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {"rates": {"explode": 0.1}},
        {"rates": {"transient": 1.5}},
        {"rates": {"transient": 0.6, "throttle": 0.6}},
        {"script": {"o-1": ["nope"]}},
        {"script": {"o-1": ["always:transient", "ok"]}},
        {"script": {"o-1": "transient"}},
        {"script": {"o-1/nope": ["transient"]}},
        {"script": {"o-1/charge": ["transient"]}, "service": "inventory"},
        {"script": {"/reserve": ["transient"]}},
        {"service": "billing"},
        {"service": 3},
        {"rate": {"transient": 0.1}},
        {"slow_seconds": -1},
        {"retry_after_seconds": 0.5},
        ["not", "an", "object"],
    ],
)
def test_invalid_faults_are_400_and_change_nothing(fake_remote, body):
    fake_remote.set_faults(script={"o-1": ["transient"]})
    fake_remote.set_faults(script={"o-2": ["drop"]}, service="payments", slow_seconds=3)
    before = fake_remote.config()
    response = requests.post(f"{fake_remote.url}/_control/faults", json=body, timeout=5)

    assert response.status_code == 400
    assert response.json()["error"] in {"invalid_faults", "invalid_request"}
    assert fake_remote.config() == before


def test_python_set_faults_rejects_bad_settings(fake_remote):
    with pytest.raises(FaultConfigError):
        fake_remote.set_faults(rates={"transient": -0.1})
    with pytest.raises(TypeError):
        fake_remote.set_faults(slow=1)
    with pytest.raises(FaultConfigError):
        fake_remote.set_faults(service="billing")
    with pytest.raises(FaultConfigError):
        fake_remote.set_faults(script={"o-1/release": ["transient"]}, service="payments")
    with pytest.raises(FaultConfigError):
        fake_remote.config("billing")


def test_reset_clears_effects_and_restores_the_start_faults():
    with start(
        port=0, script={"o-1": ["transient"]}, rates={"throttle": 0.0}, slow_seconds=5,
        service_faults={"payments": {"script": {"o-1": ["permanent"]}, "retry_after_seconds": 4}},
    ) as svc:  # fmt: skip
        assert reserve(svc.url, "o-1", "k").status_code == 503
        assert reserve(svc.url, "o-1", "k").status_code == 200
        assert call(svc.url, "o-1", "k", service="payments", action="charge").status_code == 422
        assert call(svc.url, "o-1", "k-refund", service="payments", action="refund").status_code == 200
        svc.set_faults(rates={"transient": 1.0}, slow_seconds=1)

        response = requests.post(f"{svc.url}/_control/reset", timeout=5)
        assert response.status_code == 200
        effects = svc.effects()
        assert (effects["total"], effects["calls"], effects["by_key"], effects["noop_compensations"]) == (0, 0, {}, 0)
        assert all(s["calls"] == 0 and s["applied"] == {} for s in effects["services"].values())
        assert svc.config("inventory")["slow_seconds"] == 5
        assert (svc.config("payments")["slow_seconds"], svc.config("payments")["retry_after_seconds"]) == (5, 4)
        assert svc.config("payments")["script"] == {"o-1": ["permanent"]}
        # The start script runs again from its beginning; the key can be applied again.
        assert reserve(svc.url, "o-1", "k").status_code == 503
        assert reserve(svc.url, "o-1", "k").status_code == 200
        assert call(svc.url, "o-1", "k", service="payments", action="charge").status_code == 422
        assert svc.effects()["by_key"] == {"k": 1}


def test_start_rejects_invalid_faults():
    with pytest.raises(FaultConfigError):
        start(port=0, rates={"transient": 2})
    with pytest.raises(FaultConfigError):
        start(port=0, script={"o-1": ["always:"]})
    with pytest.raises(FaultConfigError):
        start(port=0, service_faults={"billing": {"rates": {"transient": 0.1}}})
    with pytest.raises(FaultConfigError):
        start(port=0, service_faults={"payments": {"rate": {"transient": 0.1}}})


@pytest.mark.parametrize(
    "services",
    [
        {},
        {"inventory": {}},
        {"Inventory": {"reserve": "release"}},
        {"_control": {"reserve": None}},
        {"inventory": {"reserve": "reserve"}},
        {"inventory": {"reserve": "release", "release": None}},
        {"inventory": {"re/serve": None}},
        {"inventory": ["reserve"]},
    ],
)
def test_start_rejects_invalid_services(services):
    with pytest.raises(FaultConfigError):
        start(port=0, services=services)
