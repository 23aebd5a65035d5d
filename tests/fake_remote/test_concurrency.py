"""Concurrent calls: one key applies once; different keys and services do not wait for each other."""

from __future__ import annotations

import threading
import time

import requests

from tests.fake_remote.client import call, reserve, wait_until


def _concurrently(count: int, call) -> list:
    """Run call(i) in `count` threads released together; return results in order."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def run(i: int) -> None:
        barrier.wait(timeout=10)
        try:
            results[i] = call(i)
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=15)
    assert not any(thread.is_alive() for thread in threads)
    return results


def test_twenty_concurrent_calls_with_one_key_apply_once(fake_remote):
    # Applying takes 0.2 s, so without the per-key lock all 20 would apply.
    fake_remote.set_faults(apply_seconds=0.2)
    responses = _concurrently(20, lambda i: reserve(fake_remote.url, "o-1", "same-key", attempt=i))

    assert all(isinstance(r, requests.Response) for r in responses), responses
    assert [r.status_code for r in responses] == [200] * 20
    assert len({r.content for r in responses}) == 1
    assert sorted(r.headers["Idempotent-Replayed"] for r in responses) == ["false"] + ["true"] * 19
    effects = fake_remote.effects()
    assert effects["by_key"] == {"same-key": 1}
    assert effects["by_order"] == {"o-1": 1}
    assert effects["replays"] == 19


def test_a_same_key_call_during_a_slow_response_returns_the_first_result(fake_remote):
    fake_remote.set_faults(script={"o-1": ["slow"]}, slow_seconds=10)
    slow = threading.Thread(target=lambda: _ignore_timeout(lambda: reserve(fake_remote.url, "o-1", "k", timeout=0.5)))
    slow.start()
    wait_until(lambda: fake_remote.effects()["total"] == 1, what="the slow call to apply")

    started = time.monotonic()
    second = reserve(fake_remote.url, "o-1", "k", attempt=2)
    assert time.monotonic() - started < 0.4  # did not wait for the slow response
    slow.join(timeout=5)

    assert second.status_code == 200
    assert second.headers["Idempotent-Replayed"] == "true"
    assert fake_remote.effects()["by_key"] == {"k": 1}


def test_different_keys_apply_in_parallel(fake_remote):
    # 8 keys x 0.5 s would take 4 s if the lock were global.
    fake_remote.set_faults(apply_seconds=0.5)
    started = time.monotonic()
    responses = _concurrently(8, lambda i: reserve(fake_remote.url, f"o-{i}", f"k-{i}"))
    elapsed = time.monotonic() - started

    assert [r.status_code for r in responses] == [200] * 8
    assert elapsed < 2.5, f"8 keys took {elapsed:.2f}s: applying looks serialised across keys"
    assert fake_remote.effects()["total"] == 8


def test_many_concurrent_calls_with_faults_never_apply_a_key_twice(fake_remote):
    fake_remote.set_faults(rates={"transient": 0.2, "throttle": 0.1, "drop": 0.05}, seed=11)

    def call(i: int) -> list[int | str]:
        statuses = []
        with requests.Session() as session:
            for attempt in range(10):
                try:
                    statuses.append(reserve(fake_remote.url, f"o-{i % 5}", f"k-{i % 5}", attempt=attempt, session=session).status_code)
                except requests.ConnectionError:
                    statuses.append("dropped")
        return statuses

    results = _concurrently(20, call)
    assert all(isinstance(r, list) for r in results), results
    effects = fake_remote.effects()
    assert set(effects["by_key"].values()) == {1}
    assert effects["total"] == 5
    assert effects["calls"] == 200


def _ignore_timeout(call) -> None:
    try:
        call()
    except requests.ReadTimeout:
        pass


def test_concurrent_compensations_with_one_key_undo_once(fake_remote):
    assert reserve(fake_remote.url, "o-1", "k-reserve").status_code == 200
    fake_remote.set_faults(apply_seconds=0.2)
    responses = _concurrently(10, lambda i: call(fake_remote.url, "o-1", "k-release", action="release", attempt=i))

    assert [r.status_code for r in responses] == [200] * 10
    assert len({r.content for r in responses}) == 1
    assert responses[0].json()["outcome"] == "undone"
    inventory = fake_remote.effects()["services"]["inventory"]
    assert (inventory["undone"], inventory["replays"], inventory["twice"]) == ({"o-1": ["release"]}, 9, 0)
    assert fake_remote.net("o-1") == {"inventory": {"reserve": 0}}


def test_three_services_serve_concurrently(fake_remote):
    # Each service's apply takes 0.5 s; 3 services x 4 orders would take 6 s serialised.
    fake_remote.set_faults(apply_seconds=0.5)
    routes = [("inventory", "reserve"), ("payments", "charge"), ("shipping", "ship")]
    started = time.monotonic()
    responses = _concurrently(
        12, lambda i: call(fake_remote.url, f"o-{i // 3}", f"k-{i}", service=routes[i % 3][0], action=routes[i % 3][1])
    )
    elapsed = time.monotonic() - started

    assert [r.status_code for r in responses] == [200] * 12
    assert elapsed < 3, f"took {elapsed:.2f}s: services look serialised"
    effects = fake_remote.effects()
    assert effects["by_order"] == {f"o-{i}": 3 for i in range(4)}
    assert effects["twice"] == 0
