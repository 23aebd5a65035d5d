"""Where an order's id sends it: its scheduler queue, its state account, its index shard
(core/names.py). Stable across processes, even, and independent of one another."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from core import names
from tests import ROOT

IDS = [f"order-{i:06d}" for i in range(16_000)]


def test_the_spread_is_stable_across_processes():
    """Not Python's salted hash(): another interpreter puts the same ids in the same places."""
    code = ("from core import names; ids=[f'order-{i:06d}' for i in range(50)]; "
            "print([(names.scheduler_queue_shard(i), names.state_account(i, 5), names.active_shard(i, 16)) "
            "for i in ids])")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345"}, cwd=str(ROOT))
    here = [(names.scheduler_queue_shard(i), names.state_account(i, 5), names.active_shard(i, 16)) for i in IDS[:50]]
    assert other.stdout.strip() == str(here)


@pytest.mark.parametrize(("place", "count"), [
    (lambda order_id: names.scheduler_queue_shard(order_id), names.SCHEDULER_QUEUE_SHARDS),
    (lambda order_id: names.state_account(order_id, 2), 2),
    (lambda order_id: names.state_account(order_id, 5), 5),
])
def test_orders_spread_evenly(place, count):
    seen = Counter(place(order_id) for order_id in IDS)
    assert set(seen) == set(range(count))
    expected = len(IDS) / count
    assert all(abs(n - expected) < 0.06 * expected for n in seen.values()), seen


def test_every_account_holds_every_index_shard_evenly():
    """The account and the index shard read different slices of the hash: were they the
    same, account 0 of 2 would hold only the even shards, and half the index partitions of
    each account would stay empty while the other half took twice the writes."""
    accounts, shards = 2, 16
    per_account = {a: Counter() for a in range(accounts)}
    for order_id in IDS:
        per_account[names.state_account(order_id, accounts)][names.active_shard(order_id, shards)] += 1
    expected = len(IDS) / accounts / shards
    for account, seen in per_account.items():
        assert set(seen) == set(range(shards)), account
        assert all(abs(n - expected) < 0.25 * expected for n in seen.values()), (account, seen)


def test_each_queue_name_and_setting_is_derived_once():
    assert names.SCHEDULER_QUEUES == tuple(
        (f"scheduler-{shard}", f"SCHEDULER_QUEUE_{shard}") for shard in range(names.SCHEDULER_QUEUE_SHARDS)
    )
    assert names.STORAGE_QUEUES[-1] == (names.SCHEDULER_QUEUE, names.SCHEDULER_QUEUE_SETTING)  # drained, never sent to
    assert names.NAME_SETTINGS["SCHEDULER_QUEUE_3"] == "scheduler-3"


@pytest.mark.parametrize("accounts", [0, names.MAX_STATE_STORAGE_ACCOUNTS + 1])
def test_an_account_count_out_of_range_is_refused(accounts):
    with pytest.raises(ValueError, match="accounts"):
        names.state_account("o-1", accounts)
