"""The capacity and cost model (benchmarks/capacity.py) on the operation counts the bench
wrote (benchmarks/results/operations.json) and the limits table (benchmarks/azure_limits.json):
pure arithmetic, no stack."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import date

import pytest

from benchmarks import azurite_log, capacity
from benchmarks.capacity import CapacityError, Limits, Shape
from core import names
from core.workflow import CURRENT

STEPS = len(CURRENT.steps)


@pytest.fixture(scope="module")
def operations() -> dict:
    return json.loads(capacity.OPERATIONS_FILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def limits() -> Limits:
    return Limits.load()


@pytest.fixture(scope="module")
def counts(operations):
    return capacity.counts(operations)


# --- the inputs -----------------------------------------------------------------------------


def test_every_row_of_the_limits_table_names_its_source_and_the_day_it_was_read():
    rows = json.loads(capacity.LIMITS_FILE.read_text(encoding="utf-8"))["rows"]
    names = [row["name"] for row in rows]
    assert len(names) == len(set(names)), "a fact is kept once"
    for row in rows:
        assert row["source"].startswith("https://"), row["name"]
        assert date.fromisoformat(row["read"]) <= date.today(), row["name"]
        for key in ("unit", "scope", "past_limit", "note"):
            assert key in row, (row["name"], key)
        if row["value"] is None:
            assert "not found" in row["note"].lower(), f"{row['name']}: a missing price says so"


def test_the_operations_file_is_the_benchs_count_of_the_current_workflow(operations):
    assert operations["steps_per_order"] == STEPS
    assert operations["orders"] > 0 and operations["date"]
    step, fixed = operations["per_step"], operations["fixed"]
    # One transaction of two entities per step; two Service Bus messages per step, each sent,
    # delivered and completed; the orders message once per order.
    assert step["table"]["requests"] == pytest.approx(1.0, abs=0.05)
    assert step["table"]["entities_written"] == pytest.approx(2.0, abs=0.05)
    assert {k: round(v, 2) for k, v in step["servicebus"].items() if k in ("sends", "deliveries", "completes")} == {
        "sends": 2.0, "deliveries": 2.0, "completes": 2.0}
    assert fixed["servicebus"]["sends"] == pytest.approx(1.0)
    assert step["executions"]["total"] == pytest.approx(2.0, abs=0.05), "an agent and the step's recording"
    assert fixed["executions"]["total"] >= 2.0, "the submission and the first claim at least"
    assert operations["cpu_ms_per_order"]["host"] > 0
    roles = operations["table_by_role"]
    assert roles[azurite_log.INDEX_UPSERT]["entities_written"] == pytest.approx(1.0, abs=0.05)
    assert roles[azurite_log.INDEX_DELETE]["entities_written"] == pytest.approx(1.0, abs=0.05)


def test_operations_record_tells_a_steps_executions_from_the_orders_fixed_part():
    record = capacity.operations_record(
        machine={"date": "2026-11-24 00:00 UTC", "cores": "2", "azure-core": "1.0"}, options={}, orders=10,
        steps=30, steps_per_order=3,
        table={"per_step": {"requests": 1.0, "entities_written": 2.0, "reads": 0.0},
               "fixed": {"requests": 4.0, "entities_written": 5.0}, "by_role": {}},
        queue={"queue send": 1.0, "queue receive": 0.25, "queue delete": 1.0},
        servicebus={"per_step": {"sends": 2.0, "deliveries": 2.0, "completes": 2.0},
                    "fixed": {"sends": 1.0, "deliveries": 1.0, "completes": 1.0}},
        invocations={"run_inventory_agent": [5] * 10, "run_payments_agent": [5] * 10, "run_shipping_agent": [5] * 10,
                     "complete_step": [3] * 30, "submit_order": [4] * 10, "schedule_order": [6] * 10,
                     "supervise": [2]},
        cpu_seconds={"host-1": 0.2, "worker-1": 0.3, "azurite": 0.2, "servicebus": 0.1, "wall": 9.0},
        payload_bytes={"orders_message": 100},
    )
    assert set(record["per_step"]["executions"]["by_function"]) == {
        "run_inventory_agent", "run_payments_agent", "run_shipping_agent", "complete_step"}
    assert record["per_step"]["executions"]["total"] == pytest.approx(2.0)
    assert record["per_step"]["executions"]["ms"] == pytest.approx((3 * 10 * 5 + 30 * 3) / 30)
    assert record["fixed"]["executions"]["total"] == pytest.approx(2.1)  # submit, schedule, one tick in 10 orders
    assert record["fixed"]["queue"]["total"] == pytest.approx(2.25)
    # What the model charges: an instance's whole CPU, its worker processes and its host process.
    cpu = record["cpu_ms_per_order"]
    assert (cpu["host"], cpu["workers"], cpu["host_process"]) == pytest.approx((50.0, 30.0, 20.0))
    assert cpu["azurite"] == pytest.approx(20.0) and cpu["servicebus_emulator"] == pytest.approx(10.0)
    assert record["versions"] == {"azure-core": "1.0"}


def test_steps_scale_the_per_step_part_only(operations, counts):
    five = capacity.counts(operations, 5)
    step = operations["per_step"]
    # A step's requests: its transaction and the scheduler's read of the order's partition,
    # charged at least once per step though one host's run reads from its cache (a miss at scale).
    assert capacity.READS_PER_STEP >= 1
    assert five.table_requests - counts.table_requests == pytest.approx(
        2 * (step["table"]["requests"] + max(step["table"]["reads"], capacity.READS_PER_STEP)))
    assert five.sb_credits - counts.sb_credits == pytest.approx(2 * (step["servicebus"]["sends"]
                                                                   + step["servicebus"]["deliveries"]))
    assert five.queue_operations == counts.queue_operations
    assert five.index_entities == counts.index_entities
    with pytest.raises(CapacityError):
        capacity.counts(operations, 0)


def test_a_step_is_charged_its_partition_read_however_few_one_host_measured(operations):
    """One host decides on its own cache nearly always, and its run counts ~0 reads per step;
    at scale a response mostly reaches an instance that did not write the order, and reads it."""
    measured = operations["steps_per_order"] * operations["per_step"]["table"]["reads"]
    one_host = json.loads(json.dumps(operations))
    one_host["per_step"]["table"]["reads"] = 0.01
    one_host["fixed"]["table"]["requests"] += 0.01 * operations["steps_per_order"] - measured
    for steps in (None, 5):
        assert capacity.counts(one_host, steps).table_requests == pytest.approx(
            capacity.counts(operations, steps).table_requests)


# --- the model ------------------------------------------------------------------------------


def test_at_50_orders_per_second_on_standard_the_namespace_credits_saturate_first(counts, limits):
    result = capacity.evaluate(50, Shape(serviceBusSku="Standard"), counts, limits)
    assert result.bottleneck == "servicebus.namespace"
    assert result.utilisation["servicebus.namespace"] == pytest.approx(50 * counts.sb_credits / 1000)
    # Sends and deliveries of 7 messages: 14 credits, about 71 orders/s on one Standard namespace.
    assert counts.sb_credits == pytest.approx(2 * (1 + 2 * STEPS), abs=0.1)
    assert capacity.evaluate(80, Shape(), counts, limits).utilisation["servicebus.namespace"] > 1


def test_the_active_index_shards_divide_the_hottest_partitions_load(counts, limits):
    one = capacity.evaluate(1000, Shape(activeIndexShards=1, serviceBusSku="Premium", serviceBusCapacity=16),
                            counts, limits)
    sixteen = capacity.evaluate(1000, replace(one.shape, activeIndexShards=16), counts, limits)
    shard = "table.partition.active_index_shard"
    assert one.utilisation[shard] == pytest.approx(1000 * counts.index_entities / 2000)
    assert sixteen.utilisation[shard] == pytest.approx(one.utilisation[shard] / 16)


def test_a_separate_state_account_splits_the_requests(counts, limits):
    shared = capacity.evaluate(500, Shape(), counts, limits)
    split = capacity.evaluate(500, Shape(separateStateStorage=True), counts, limits)
    assert shared.utilisation["storage.account"] == pytest.approx(
        split.utilisation["storage.account.state"] + split.utilisation["storage.account.host"])
    assert "storage.account" not in split.utilisation


def test_state_accounts_and_scheduler_queues_divide_their_load(counts, limits):
    """Orders spread evenly by id: each of A state accounts takes 1/A of the table requests,
    each of the scheduler's queues 1/K of the nudges; the host's account keeps the queues' operations."""
    one = capacity.evaluate(2000, Shape(separateStateStorage=True), counts, limits)
    four = capacity.evaluate(2000, Shape(separateStateStorage=True, stateStorageAccounts=4), counts, limits)
    assert four.utilisation["storage.account.state"] == pytest.approx(one.utilisation["storage.account.state"] / 4)
    assert four.utilisation["storage.account.host"] == pytest.approx(one.utilisation["storage.account.host"])
    # More than one state account means accounts of their own, separateStateStorage or not.
    assert capacity.evaluate(2000, Shape(stateStorageAccounts=4), counts, limits).utilisation == four.utilisation
    single = capacity.evaluate(2000, Shape(schedulerQueues=1), counts, limits)
    shares = single.utilisation["queue.scheduler"] / names.SCHEDULER_QUEUE_SHARDS
    assert one.utilisation["queue.scheduler"] == pytest.approx(shares)
    assert Shape().schedulerQueues == names.SCHEDULER_QUEUE_SHARDS, "the app's own count by default"


def test_the_search_gives_the_state_as_many_accounts_as_it_needs(counts, limits):
    rate, base = 5000, Shape(serviceBusSku="Premium", serviceBusCapacity=16, separateStateStorage=True)
    shape = capacity._sized(rate, base, counts, limits, capacity.MAX_UTILISATION, 1.0)
    per_account = limits["storage.account.requests_per_second"] * capacity.MAX_UTILISATION
    assert shape.stateStorageAccounts == math.ceil(rate * counts.table_requests / per_account) > 1
    def state_share(s: Shape) -> float:
        return capacity.evaluate(rate, s, counts, limits).utilisation["storage.account.state"]

    assert state_share(shape) <= capacity.MAX_UTILISATION
    assert state_share(replace(shape, stateStorageAccounts=shape.stateStorageAccounts - 1)) > capacity.MAX_UTILISATION


def test_one_deployment_is_no_longer_capped_by_its_queue_or_its_state_account(counts, limits):
    """The largest stamp: 8 state accounts and the app's 8 scheduler queues; what caps it is
    the region's Flex memory quota and the namespace, well past the single queue's ~1,600."""
    rates = capacity.ceiling(capacity.LARGEST, counts, limits)
    first = next(iter(rates))
    assert first in ("functions.regional_memory_quota", "servicebus.namespace"), rates
    assert rates["queue.scheduler"] >= 10_000 and rates["storage.account.state"] >= 10_000
    single = capacity.ceiling(replace(capacity.LARGEST, schedulerQueues=1, stateStorageAccounts=1), counts, limits)
    assert rates["queue.scheduler"] == pytest.approx(names.SCHEDULER_QUEUE_SHARDS * single["queue.scheduler"])
    assert rates["storage.account.state"] == pytest.approx(8 * single["storage.account.state"])


def test_a_cheapest_shape_holds_10000_orders_per_second(counts, limits):
    result = capacity.cheapest(10_000, counts, limits)
    assert result.holds(capacity.MAX_UTILISATION)
    assert max(result.utilisation.values()) <= 1
    assert result.shape.serviceBusSku == "Premium"
    # Every stamp carries its share; the shape evaluated again gives the same figures.
    again = capacity.evaluate(10_000, result.shape, counts, limits)
    assert again.utilisation == result.utilisation
    # One fewer stamp, all else equal, breaks some limit (the search did not over-provision).
    if result.shape.stamps > 1:
        stamps = result.shape.stamps - 1
        fewer = capacity.evaluate(10_000, replace(result.shape, stamps=stamps, regions=min(stamps, result.shape.regions)),
                                  counts, limits)
        assert not fewer.holds(capacity.MAX_UTILISATION)


def test_stamps_in_one_region_share_its_memory_quota(counts, limits):
    """Flex Consumption's memory quota is per subscription and region: two stamps in one
    region use twice the quota one does; in two regions, each uses its own."""
    two = replace(capacity.LARGEST, stamps=2)
    together = capacity.evaluate(4000, replace(two, regions=1), counts, limits).utilisation
    apart = capacity.evaluate(4000, replace(two, regions=2), counts, limits).utilisation
    assert together["functions.regional_memory_quota"] == pytest.approx(2 * apart["functions.regional_memory_quota"])
    assert {k: v for k, v in together.items() if k != "functions.regional_memory_quota"} == {
        k: v for k, v in apart.items() if k != "functions.regional_memory_quota"}


def test_at_10000_orders_per_second_the_cheapest_shape_spreads_its_stamps_over_the_regions_it_needs(counts, limits):
    result = capacity.cheapest(capacity.TARGET_RATE, counts, limits)
    assert result.shape.stamps > 1 and result.holds(capacity.MAX_UTILISATION)
    if result.shape.regions > 1:  # fewer regions would overfill one region's memory quota
        crowded = capacity.evaluate(capacity.TARGET_RATE, replace(result.shape, regions=result.shape.regions - 1),
                                    counts, limits)
        assert crowded.utilisation["functions.regional_memory_quota"] > capacity.MAX_UTILISATION


def test_the_ceiling_says_how_many_stamps_and_regions_10000_orders_per_second_take(counts, limits, capsys):
    needed = capacity.stamps_for(capacity.TARGET_RATE, capacity.LARGEST, counts, limits)
    stamp = next(iter(capacity.ceiling(capacity.LARGEST, counts, limits).values()))
    assert needed["stamps"] == math.ceil(capacity.TARGET_RATE / stamp)
    shape = replace(capacity.LARGEST, stamps=needed["stamps"], regions=needed["regions"])
    assert capacity.evaluate(capacity.TARGET_RATE, shape, counts, limits).holds(capacity.MAX_UTILISATION)
    fewer = replace(shape, stamps=needed["stamps"] - 1, regions=min(needed["regions"], needed["stamps"] - 1))
    assert not capacity.evaluate(capacity.TARGET_RATE, fewer, counts, limits).holds(capacity.MAX_UTILISATION)
    assert capacity.main(["--ceiling", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["stamps_for"]["stamps"] == needed["stamps"] and printed["stamps_for"]["regions"] == needed["regions"]
    assert capacity.main(["--ceiling"]) == 0
    assert f"{needed['stamps']} stamps of it" in capsys.readouterr().out


def test_the_cheapest_shape_costs_no_more_than_any_shape_that_holds(counts, limits):
    best = capacity.cheapest(1000, counts, limits)
    for shape in (Shape(serviceBusSku="Premium", serviceBusCapacity=16, maximumInstanceCount=1000, stamps=1),
                  Shape(serviceBusSku="Premium", serviceBusCapacity=8, maximumInstanceCount=1000, stamps=2),
                  Shape(serviceBusSku="Standard", maximumInstanceCount=400, stamps=20)):
        other = capacity.evaluate(1000, shape, counts, limits)
        if other.holds(capacity.MAX_UTILISATION):
            # Fewer stamps are preferred unless more stamps save the tolerance.
            slack = 1 + capacity.STAMP_TOLERANCE if shape.stamps > best.shape.stamps else 1
            assert best.cost_per_million_orders_usd["total"] <= other.cost_per_million_orders_usd["total"] * slack


def test_costs_add_up(counts, limits):
    for rate, shape in ((50, Shape()), (1000, Shape(serviceBusSku="Premium", serviceBusCapacity=8))):
        cost = capacity.evaluate(rate, shape, counts, limits).cost_per_million_orders_usd
        assert set(cost) == {"functions", "servicebus", "tables", "queues", "telemetry", "total"}
        assert cost["total"] == pytest.approx(sum(cost[s] for s in capacity.SERVICES))
        assert all(cost[s] > 0 for s in capacity.SERVICES)
    # By hand: Premium is a fixed price per messaging unit and hour, spread over the orders.
    premium = capacity.evaluate(1000, Shape(serviceBusSku="Premium", serviceBusCapacity=8), counts, limits)
    per_hour = limits["price.servicebus.premium.mu_per_hour"] * 8
    assert premium.cost_per_million_orders_usd["servicebus"] == pytest.approx(per_hour / (1000 * 3600) * 1e6)
    # Tables are per operation: the same per order at any load. Queues are per operation
    # too, with the polls (receives) of the load's rate.
    small = capacity.evaluate(10, Shape(), counts, limits).cost_per_million_orders_usd
    assert small["tables"] == pytest.approx(premium.cost_per_million_orders_usd["tables"])
    polls = capacity.queue_receives_per_order(10, Shape(), counts, limits, capacity.queue_polling())
    operations = counts.queue_operations - counts.queue_receives + polls
    assert small["queues"] == pytest.approx(operations * limits["price.queue.operations_per_10k"] * 100)


def test_the_polling_model_reads_host_json():
    polling = capacity.queue_polling()
    host = json.loads(capacity.HOST_JSON.read_text(encoding="utf-8"))["extensions"]["queues"]
    assert polling["batch_size"] == host["batchSize"]
    h, m, s = (float(x) for x in host["maxPollingInterval"].split(":"))
    assert polling["max_polling_interval_s"] == h * 3600 + m * 60 + s


def test_the_scheduler_queues_polls_per_order_fall_with_the_load_within_the_documented_bounds(counts, limits):
    """Each queue's pollers poll at most every 100 ms and at least every maxPollingInterval,
    each poll taking up to batchSize messages: at low load the bench's own count (with its
    empty polls) stands, at high load the 100-ms bound caps the polls per order."""
    polling = capacity.queue_polling()
    shape = Shape(serviceBusSku="Premium", serviceBusCapacity=8)

    def per_order(rate):
        return capacity.queue_receives_per_order(rate, shape, counts, limits, polling)

    assert per_order(10) >= counts.queue_receives  # the bench's count, or the idle floor above it
    assert per_order(1000) < per_order(100) < per_order(10)
    # At 1,000 orders/s: 125 nudges/s per queue, read by the instances its CPU needs.
    per_queue = 1000 * counts.queue_sends / shape.schedulerQueues
    cores = limits["functions.flex.cores.2048"]
    pollers = math.ceil(per_queue * counts.cpu_seconds / counts.executions / cores)
    fastest = shape.schedulerQueues * pollers / limits["functions.queue_trigger.min_polling_interval_s"]
    assert per_order(1000) <= (fastest + 1 / polling["max_polling_interval_s"]) / 1000
    assert per_order(1000) >= shape.schedulerQueues * (per_queue / polling["batch_size"]) / 1000


def test_tiered_prices_are_charged_tier_by_tier():
    tiers = [[13_000_000, 0.0], [100_000_000, 0.80], [2_500_000_000, 0.50], [None, 0.20]]
    assert capacity._tiered(10_000_000, tiers) == 0
    assert capacity._tiered(50_000_000, tiers) == pytest.approx(37 * 0.80)
    assert capacity._tiered(3_000_000_000, tiers) == pytest.approx(87 * 0.80 + 2400 * 0.50 + 500 * 0.20)


def test_peers_at_their_published_prices(limits):
    p = capacity.peers(1000, limits, saga_seconds=1.0)
    assert p["step_functions_standard"]["usd_per_million_orders"] == pytest.approx(3 * 25)
    assert p["step_functions_express"]["usd_per_million_orders"] == pytest.approx(1 + 1e6 * 1.0 * 0.0625 * 0.00001667)
    assert p["durable_task_scheduler"]["usd_per_million_orders"] is None, "no price found: none invented"
    assert p["durable_task_scheduler"]["capacity_units"] == math.ceil(1000 * 7 / 2000)
    # 4 actions per order; past 200M actions a month, the last published rate ($25/M) plus 10%.
    assert p["temporal_cloud"]["usd_per_million_orders"] == pytest.approx(4 * 25 * 1.1, rel=0.01)


# --- the command ----------------------------------------------------------------------------


def test_json_output_has_the_agreed_keys(capsys):
    assert capacity.main(["--orders-per-second", "50", "--shape", "serviceBusSku=Standard", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("orders_per_second", "shape", "bottleneck", "utilisation", "cost_per_million_orders_usd"):
        assert key in out
    assert out["orders_per_second"] == 50
    assert out["bottleneck"] == "servicebus.namespace"
    assert set(out["shape"]) >= {"serviceBusSku", "serviceBusCapacity", "serviceBusPartitions", "separateStateStorage",
                                 "maximumInstanceCount", "instanceMemoryMB", "activeIndexShards"}
    assert set(out["cost_per_million_orders_usd"]) == {"total", *capacity.SERVICES}


def test_without_a_shape_it_prints_the_cheapest_and_steps_scale(capsys):
    assert capacity.main(["--orders-per-second", "1000", "--steps", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 5
    assert max(out["utilisation"].values()) <= capacity.MAX_UTILISATION


@pytest.mark.parametrize("shape, message", [
    ("serviceBusSku=Basic", "serviceBusSku"),
    ("serviceBusCapacity=3", "serviceBusCapacity"),
    ("serviceBusSku=Premium,serviceBusCapacity=2,serviceBusPartitions=4", "multiple of the partitions"),
    ("instanceMemoryMB=1024", "instanceMemoryMB"),
    ("maximumInstanceCount=5000", "at most 1000"),
    ("activeIndexShards=zero", "whole number"),
    ("separateStateStorage=yes", "true or false"),
    ("stateStorageAccounts=0", "stateStorageAccounts must be 1 to"),
    ("stateStorageAccounts=65", "stateStorageAccounts must be 1 to"),
    ("noSuchParameter=1", "key=value pairs"),
    ("stamps=2,regions=3", "cannot exceed stamps"),
])
def test_a_bad_shape_is_refused_with_a_clear_error(capsys, shape, message):
    assert capacity.main(["--orders-per-second", "10", "--shape", shape]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_or_foreign_operations_file_says_how_to_make_it(tmp_path, capsys):
    assert capacity.main(["--orders-per-second", "10", "--operations", str(tmp_path / "none.json")]) == 2
    assert "--phases ops" in capsys.readouterr().err
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"steps_per_order": 3}))
    assert capacity.main(["--orders-per-second", "10", "--operations", str(foreign)]) == 2
    assert "does not hold what the bench writes" in capsys.readouterr().err


def test_docs_scale_shows_what_the_model_gives_now(operations, counts, limits):
    """docs/scale.md's tables are generated (`--update-docs`), never typed: they match the files."""
    doc = capacity.SCALE_DOC.read_text(encoding="utf-8")
    begin, end = doc.index(capacity.DOC_BEGIN) + len(capacity.DOC_BEGIN), doc.index(capacity.DOC_END)
    assert doc[begin:end].strip() == capacity.markdown(counts, limits, operations).strip(), (
        "run `python -m benchmarks.capacity --update-docs`")
    assert capacity.COST_CHART.exists()


def test_the_ceiling_of_one_stamp_is_where_its_first_resource_reaches_the_share(counts, limits):
    rates = capacity.ceiling(Shape(), counts, limits)
    first, rate = next(iter(rates.items()))
    assert first == "servicebus.namespace", "a Standard namespace fills first"
    assert list(rates.values()) == sorted(rates.values())
    at = capacity.evaluate(rate, Shape(), counts, limits)
    assert at.utilisation[first] == pytest.approx(capacity.MAX_UTILISATION)
    assert at.bottleneck == first
    assert "table.partition.order" not in rates, "an order's partition does not fill with the load"
    largest = capacity.ceiling(capacity.LARGEST, counts, limits)
    assert next(iter(largest.values())) > rate


def test_the_telemetry_line(counts, limits):
    """Each record type by hand: the sampled spans and their dependency spans scale with traceSampleRatio;
    the failing orders' records do not; the per-instance metrics are shared by the orders the instances carry."""
    assert counts.spans > 0 and counts.span_bytes > 0 and counts.sdk_calls > counts.table_requests
    price = limits["price.loganalytics.analytics_gb"] / 1e9 * 1e6  # USD per million orders, per byte per order
    shape = Shape(serviceBusSku="Premium", serviceBusCapacity=8)
    default = capacity.evaluate(1000, shape, counts, limits)
    every = capacity.evaluate(1000, replace(shape, traceSampleRatio=1.0), counts, limits)
    spans = every.telemetry["spans"]
    assert spans["records"] == pytest.approx(counts.spans)
    assert spans["usd_per_million"] == pytest.approx(counts.spans * counts.span_bytes * price)
    for kind in ("spans", "dependencies"):
        assert default.telemetry[kind]["usd_per_million"] == pytest.approx(every.telemetry[kind]["usd_per_million"]
                                                                          * shape.traceSampleRatio)
    for kind in ("traces", "requests", "exceptions"):  # a failed order's records: kept whatever the sampling
        assert default.telemetry[kind] == every.telemetry[kind]
    failing = capacity.FAILING_SHARE
    assert default.telemetry["traces"]["records"] == pytest.approx(counts.app_warnings + 2 * failing)
    assert default.telemetry["requests"]["bytes"] == pytest.approx(failing * limits["telemetry.bytes.request"])
    # Metrics are per instance and minute: per order, they shrink as the instances fill up.
    rows = default.telemetry["metrics"]["records"]
    per_minute = ((counts.metric_series + limits["telemetry.performance_counters_per_export"])
                  + counts.functions_active * limits["telemetry.host_aggregator_rows_per_function_per_flush"] * 2)
    assert rows == pytest.approx(per_minute * default.instances / (1000 * 60))
    assert default.cost_per_million_orders_usd["telemetry"] == pytest.approx(
        sum(kind["usd_per_million"] for kind in default.telemetry.values()))
    # The deployed defaults keep the line under a dollar per million orders (issue 36's target).
    assert default.cost_per_million_orders_usd["telemetry"] < 1.0
    assert every.cost_per_million_orders_usd["telemetry"] > 10 * default.cost_per_million_orders_usd["telemetry"]

