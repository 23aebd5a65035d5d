"""Faults drawn by rate with a seed: honoured, reproducible, sticky permanent."""

from __future__ import annotations

from collections import Counter

import requests

from tests.fake_remote.client import call, reserve


def _run(url: str, calls: int, prefix: str = "o") -> list[int]:
    with requests.Session() as session:
        return [reserve(url, f"{prefix}-{i}", f"{prefix}-key-{i}", session=session).status_code for i in range(calls)]


def test_rates_are_roughly_honoured(fake_remote, report_figure):
    fake_remote.set_faults(rates={"transient": 0.1, "throttle": 0.05, "permanent": 0.02}, seed=1)
    statuses = Counter(_run(fake_remote.url, 1000))

    report_figure(f"fake remote rates over 1000 calls (10% / 5% / 2% asked): {dict(statuses)}")
    assert 70 <= statuses[503] <= 130
    assert 25 <= statuses[429] <= 75
    assert 5 <= statuses[422] <= 40
    effects = fake_remote.effects()
    assert effects["total"] == statuses[200]
    assert effects["faults"]["transient"] == statuses[503]


def test_same_seed_same_faults_other_seed_other_faults(fake_remote):
    fake_remote.set_faults(rates={"transient": 0.2}, seed=7)
    first = _run(fake_remote.url, 200)
    fake_remote.reset()
    fake_remote.set_faults(rates={"transient": 0.2}, seed=7)
    again = _run(fake_remote.url, 200)
    fake_remote.reset()
    fake_remote.set_faults(rates={"transient": 0.2}, seed=8)
    other = _run(fake_remote.url, 200)

    assert first == again
    assert first != other


def test_rate_drawn_faults_other_than_permanent_are_decided_per_call(fake_remote):
    fake_remote.set_faults(rates={"transient": 0.5}, seed=3)
    with requests.Session() as session:
        statuses = [reserve(fake_remote.url, "o-1", f"k-{i}", step=f"s{i}", session=session).status_code for i in range(40)]
        same_key = [reserve(fake_remote.url, "o-2", "k", session=session).status_code for _ in range(40)]

    assert 503 in statuses and 200 in statuses
    assert 503 in same_key and 200 in same_key  # a retry with the same key gets a fresh draw
    assert fake_remote.effects()["by_key"]["k"] == 1


def test_rate_drawn_permanent_is_sticky_per_order(fake_remote):
    fake_remote.set_faults(rates={"permanent": 0.3}, seed=5)
    first = _run(fake_remote.url, 200)
    failed = [i for i, status in enumerate(first) if status == 422]
    assert 30 <= len(failed) <= 90

    with requests.Session() as session:
        for i in failed:
            same_key = reserve(fake_remote.url, f"o-{i}", f"o-key-{i}", attempt=2, session=session).status_code
            new_step = reserve(fake_remote.url, f"o-{i}", f"o-other-{i}", step="next", session=session).status_code
            assert (same_key, new_step) == (422, 422), f"order o-{i} recovered"
    assert not any(order in fake_remote.effects()["by_order"] for order in (f"o-{i}" for i in failed))


def test_rate_drawn_permanent_never_rejects_a_replay_of_an_applied_key(fake_remote):
    assert reserve(fake_remote.url, "o-1", "k-1").status_code == 200
    fake_remote.set_faults(rates={"permanent": 1.0})

    replay = reserve(fake_remote.url, "o-1", "k-1", attempt=2)
    new_key = reserve(fake_remote.url, "o-1", "k-2", step="next")

    assert replay.status_code == 200
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert new_key.status_code == 422
    assert fake_remote.effects()["by_order"] == {"o-1": 1}


def test_scripted_orders_ignore_rates(fake_remote):
    fake_remote.set_faults(script={"o-1": ["transient"]}, rates={"transient": 1.0})
    statuses = [reserve(fake_remote.url, "o-1", "k").status_code for _ in range(3)]
    assert statuses == [503, 200, 200]
    assert reserve(fake_remote.url, "o-2", "k-2").status_code == 503


def test_a_sticky_permanent_refuses_the_orders_actions_not_its_compensations(fake_remote):
    fake_remote.set_faults(rates={"permanent": 0.5}, seed=2)
    first = _run(fake_remote.url, 60)
    refused = [i for i, status in enumerate(first) if status == 422]
    assert refused

    with requests.Session() as session:
        again = [reserve(fake_remote.url, f"o-{i}", f"o-again-{i}", step="again", session=session).status_code
                 for i in refused]  # fmt: skip
        releases = [call(fake_remote.url, f"o-{i}", f"o-release-{i}", action="release", session=session).status_code
                    for i in refused]  # fmt: skip
    assert set(again) == {422}
    assert 200 in releases  # drawn on their own: about half pass
    sticky = fake_remote.config("inventory")["sticky_permanent"]
    assert sorted(sticky["action"]) == sorted(f"o-{i}" for i in refused)


def test_rates_for_one_service_draw_only_there(fake_remote):
    fake_remote.set_faults(service="payments", rates={"transient": 0.5}, seed=4)
    with requests.Session() as session:
        reserves = [reserve(fake_remote.url, f"o-{i}", f"k-{i}", session=session).status_code for i in range(40)]
        charges = [call(fake_remote.url, f"o-{i}", f"k-{i}", service="payments", action="charge", session=session)
                   .status_code for i in range(40)]  # fmt: skip

    assert set(reserves) == {200}
    assert 503 in charges and 200 in charges
