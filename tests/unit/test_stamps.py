"""The stamp routing rule (core/names.py ``stamp_of``): stable, even over the stamps, and
independent of the spreads inside one stamp (index shards, state accounts, scheduler
queues), so every stamp still uses all of its shards, accounts and queues evenly."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from core import names

ORDERS = [f"o-{i}" for i in range(32_000)]


def assert_even(counts: Counter, places: int, total: int, *, within: float = 0.1) -> None:
    assert len(counts) == places, f"only {len(counts)} of {places} places used: {counts}"
    expected = total / places
    assert max(counts.values()) < (1 + within) * expected, counts
    assert min(counts.values()) > (1 - within) * expected, counts


def test_the_rule_is_the_last_eight_bytes_of_the_ids_sha256_modulo_the_stamps():
    # Written out as a client in another language would, from STAMP_RULE's words.
    for order_id in ("o-1002", "ordre-é-7", "A" * 100):
        digest = hashlib.sha256(order_id.encode("utf-8")).digest()
        for stamps in (1, 2, 3, 4, 16):
            assert names.stamp_of(order_id, stamps) == int.from_bytes(digest[24:32], "big") % stamps
    assert "last 8 bytes of the SHA-256 of the order id" in names.STAMP_RULE


def test_the_rule_is_stable_across_processes_and_calls():
    # Fixed answers: a changed hash or slice would send in-flight orders' resends and
    # operators' look-ups to the wrong stamp.
    assert [names.stamp_of(f"o-{i}", 4) for i in range(8)] == [
        int.from_bytes(hashlib.sha256(f"o-{i}".encode()).digest()[24:], "big") % 4 for i in range(8)
    ]
    assert names.stamp_of("o-1002", 4) == names.stamp_of("o-1002", 4)
    assert names.stamp_of("o-1002", 1) == 0


@pytest.mark.parametrize("stamps", [2, 3, 4, 8])
def test_the_stamps_share_the_orders_evenly(stamps):
    assert_even(Counter(names.stamp_of(o, stamps) for o in ORDERS), stamps, len(ORDERS))


@pytest.mark.parametrize(
    ("spread", "places"),
    [
        (lambda o: names.active_shard(o, 16), 16),
        (lambda o: names.state_account(o, 8), 8),
        (names.scheduler_queue_shard, names.SCHEDULER_QUEUE_SHARDS),
    ],
    ids=["index shards", "state accounts", "scheduler queues"],
)
def test_within_each_stamp_the_shards_accounts_and_queues_still_spread_evenly(spread, places):
    stamps = 4
    for stamp in range(stamps):
        mine = [o for o in ORDERS if names.stamp_of(o, stamps) == stamp]
        assert_even(Counter(spread(o) for o in mine), places, len(mine), within=0.15)


@pytest.mark.parametrize("stamps", [0, names.MAX_STAMPS + 1])
def test_a_stamp_count_out_of_range_is_refused(stamps):
    with pytest.raises(ValueError, match=f"1 to {names.MAX_STAMPS} stamps"):
        names.stamp_of("o-1", stamps)
