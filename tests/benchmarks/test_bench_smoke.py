"""Smoke tests of ``make bench``: every phase but recovery in its smallest form, on real
local stacks (Azurite, the Service Bus emulator, the fake remote, a local host), plus the
per-step arithmetic, the Azurite log's roles and the sections kept from an earlier report
on fixed inputs. They check the report's shape and that a step's cost is counted apart
from the order's fixed part: speed is reported, never asserted."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from benchmarks import azurite_log, ceiling
from benchmarks.report import Report, kept_sections, write_soak_section
from benchmarks.runner import Options, Plan, Runner
from benchmarks.sweep import FINISHED_ROWS, IN_FLIGHT, IN_FLIGHT_ROWS
from core import names
from core.workflow import CURRENT

STEPS = len(CURRENT.steps)

SMALL = Plan(
    serial_ops=20, parallel=(2, 2), parallel_ops=80, op_budget=2.0, study=((1, 1), (2, 1)), study_ops=40,
    transport_reads=40, sweep_history=(0, 1000), sweep_repeats=2,
    pipeline_orders=15, pipeline_timeout=60.0, pipeline_hosts=(1,), latency_rate=4.0, latency_seconds=2.0,
    idle_seconds=3.0, ops_orders=10, warm_up_orders=5, parallel_seconds=2.0, parallel_orders=10,
)

CEILING_KEYS = [
    "ceiling.steps_per_s",
    "ceiling.steps_per_s_serial",
    "ceiling.order_steps_per_s",
    "ceiling.step_ms",
    "ceiling.order_fixed_ms",
    "ceiling.cpu_ms_per_step",
    "ceiling.cpu_ms_per_order_fixed",
    "ceiling.cpu_bound_steps_per_s",
    "ceiling.update_ops_per_s.1x1",
    "ceiling.update_ops_per_s.2x1",
    "ceiling.transport_gain_pct",
]
SWEEP_KEYS = ["sweep.sweep_ms.0", "sweep.sweep_ms.1000", "sweep.naive_ms.0", "sweep.naive_ms.1000", "sweep.ratio"]
OPERATIONS = [
    "table insert-transaction", "table point read", "table If-Match MERGE update", "table step transaction",
    "table upsert", "table delete", "storage queue send", "storage queue receive", "storage queue delete",
    "Service Bus send", "Service Bus receive", "Service Bus complete",
]
APP_KEYS = [
    "pipeline.steps_per_s.1_host", "pipeline.steps_per_s_99.1_host", "pipeline.ratio.1_host",
    "pipeline.ratio_with_fixed.1_host",
    "latency.hop_p50", "latency.hop_p95", "latency.first_step_p50", "latency.p50",
    "ops.table_writes_per_step", "ops.table_reads_per_step", "ops.table_requests_per_step", "ops.table_fixed_per_order",
    "ops.servicebus_per_step", "ops.servicebus_fixed_per_order", "ops.steps",
    "idle.storage_per_min", "idle.servicebus_receive_calls_per_min",
    "parallel.p50.sequential", "parallel.p50.parallel", "parallel.p50_ratio", "parallel.p95_ratio",
    "parallel.orders_per_s.sequential", "parallel.orders_per_s.parallel", "parallel.throughput_ratio",
    "parallel.table_per_order.sequential", "parallel.table_per_order.parallel", "parallel.table_ratio",
]

#: The resilience phases in their smallest form: a 4 s outage with a 1 s open breaker, a 5 s
#: step timeout and a sweep every second (the attempts the outage cut short are run again ~6 s
#: later, not after the default 30 s timeout and 15 s sweep: the phase took 46 s of its 77 s so),
#: a handful of orders, no warm-up.
RESILIENCE = Plan(
    warm_up_orders=0, outage_orders=16, outage_seconds=4.0, outage_hosts=2, outage_open_seconds=1.0,
    outage_settings={"STEP_TIMEOUT_SECONDS": "5", "SUPERVISOR_SCHEDULE": "*/1 * * * * *"},
    outage_timeout=90.0, concurrency_orders=8, concurrency_apply_seconds=0.3, concurrency_hosts=1,
    concurrency_cap=30.0, unknown_orders=10, unknown_call_timeout=0.3, unknown_slow_seconds=1.0, unknown_hosts=1,
    unknown_timeout=40.0,
)
RESILIENCE_KEYS = [
    "outage.compensated_or_error", "outage.calls_per_host_period", "outage.back_to_processed", "outage.openings",
    "outage.half_open_failures", "outage.lines_postponed",
    "unknown.posts_per_action.inventory", "unknown.posts_per_action.payments", "unknown.posts_per_action.shipping",
    "unknown.lookups_per_action", "unknown.twice",
    "concurrency.threads", "concurrency.dropped_steps.async", "concurrency.steps_per_s.async",
    "concurrency.dropped_steps.sync", "concurrency.steps_per_s.sync", "concurrency.ratio",
]


def test_ceiling_and_sweep_report_every_row(tmp_path):
    out, raw = tmp_path / "BENCHMARKS.md", tmp_path / "bench.json"
    out.write_text("# Benchmarks\n\nan older run\n")
    write_soak_section(out, "## Chaos soak\n\nthe last soak's figures\n")
    runner = Runner(
        Options(phases=("ceiling", "sweep"), out=out, json_out=raw, plan=SMALL),
        Console(file=io.StringIO(), width=200),
    )
    report = runner.run()
    runner.finish()

    assert [s.key for s in report.sections] == ["ceiling", "sweep"]
    assert [s.error for s in report.sections] == [None, None]
    figures = report.figures()
    for key in CEILING_KEYS + SWEEP_KEYS:
        assert key in figures, f"missing figure {key}"
        assert figures[key].value is not None, f"figure {key} was not measured"

    operations = next(t for t in report.sections[0].tables if t.title == "operations")
    labels = [row[0] for row in operations.rows]
    for name in OPERATIONS:
        assert any(label.startswith(name) for label in labels), f"no ceiling row for {name}"
    assert all(row[-1] == 0 for row in operations.rows), "an operation failed during the ceiling"
    per_step = {row[0].split(" (")[0]: row[1] for row in operations.rows if row[1]}
    assert per_step == {"table step transaction": 1, "Service Bus send": 2, "Service Bus receive": 2,
                        "Service Bus complete": 2}

    sweep_table = report.sections[1].tables[0]
    assert [row[0] for row in sweep_table.rows] == ["0", "1,000"]
    # One query per index shard, plus the partitions past them and the one of before the sharding.
    index_queries = f"index_query {names.DEFAULT_ACTIVE_INDEX_SHARDS + 2},"
    assert all("read 100" in row[-1] and index_queries in row[-1] for row in sweep_table.rows)
    assert sweep_table.rows[1][6] == FINISHED_ROWS * 1000 + (IN_FLIGHT_ROWS + 1) * IN_FLIGHT

    markdown = out.read_text()
    headings = ("# Benchmarks", "## Machine", "## Targets", "## Ceiling: raw operations",
                "## Supervisor sweep vs history")
    for heading in headings:
        assert heading in markdown
    assert "sweep(1,000) / sweep(0)" in markdown
    assert "an older run" not in markdown
    assert markdown.count("## Chaos soak") == 1 and "the last soak's figures" in markdown, "the soak's section was lost"
    assert json.loads(raw.read_text())["sections"][0]["key"] == "ceiling"


def test_app_phases_count_a_step_apart_from_the_order(tmp_path):
    """The quick path on the app and counted stacks: steps/s, step hops, operations per step;
    the parallel workflow beside the sequential one (timed on the app stack, counted on the other)."""
    out, counted = tmp_path / "BENCHMARKS.md", tmp_path / "operations.json"
    runner = Runner(
        Options(phases=("latency", "parallel", "pipeline", "idle", "ops"), out=out, operations_out=counted,
                plan=SMALL),
        Console(file=io.StringIO(), width=200),
    )
    report = runner.run()
    runner.finish()

    assert {s.key: s.error for s in report.sections} == {
        "pipeline": None, "ops": None, "latency": None, "idle": None, "parallel": None,
    }
    figures = report.figures()
    for key in APP_KEYS:
        assert key in figures, f"missing figure {key}"
        if not key.startswith("pipeline.ratio"):  # no ceiling in this run
            assert figures[key].value is not None, f"figure {key} was not measured"
    assert figures["ops.steps"].value == SMALL.ops_orders * STEPS
    assert figures["latency.hops"].value == int(SMALL.latency_rate * SMALL.latency_seconds) * (STEPS - 1)

    ops = next(s for s in report.sections if s.key == "ops")
    roles = {row[0]: row for row in next(t for t in ops.tables if t.title.startswith("table requests by role")).rows}
    # Azurite's log, read by role: one transaction of two entities per step, one submission per order.
    assert roles[azurite_log.STEP_TRANSACTION][2] == SMALL.ops_orders * STEPS
    assert roles[azurite_log.SUBMISSION][2] == SMALL.ops_orders
    sb = {row[0]: row for row in next(t for t in ops.tables if t.title.startswith("Service Bus")).rows}
    assert sb["agent-responses"][1] == STEPS, "one response sent per step"
    assert "## Operations per step and per order" in out.read_text()
    # The same counts, for the capacity model: a step's part apart from the order's fixed part.
    operations = json.loads(counted.read_text())
    assert (operations["orders"], operations["steps_per_order"]) == (SMALL.ops_orders, STEPS)
    assert operations["per_step"]["servicebus"]["sends"] == 2
    assert operations["per_step"]["table"]["requests"] == 1
    assert operations["per_step"]["executions"]["total"] == pytest.approx(2), "an agent and complete_step per step"
    cpu = operations["cpu_ms_per_order"]
    # Per process: the worker (the app side, Microsoft's runtime and the functions) apart from the
    # host process (the local host standing in for Azure's); the model charges an instance both.
    assert cpu["workers"] > 0 and cpu["host_process"] > 0 and cpu["azurite"] > 0
    assert cpu["host"] == pytest.approx(cpu["workers"] + cpu["host_process"])
    assert "workers" in cpu["note"] and "host_process" in cpu["note"]
    assert figures["ops.workers_cpu_per_order"].value == pytest.approx(cpu["workers"])
    assert figures["ops.host_process_cpu_per_order"].value == pytest.approx(cpu["host_process"])
    # The pipeline's run measured the host's worker process too.
    pipeline_table = next(s for s in report.sections if s.key == "pipeline").tables[0]
    workers_ms, host_ms = pipeline_table.columns.index("worker processes CPU ms/step"), pipeline_table.columns.index(
        "host processes CPU ms/step")
    assert pipeline_table.rows[0][workers_ms] > 0 and pipeline_table.rows[0][host_ms] > 0


def test_resilience_phases_report_every_figure(tmp_path):
    """Outage, unknown outcomes, slow remotes with async and sync agents: the figures are there."""
    runner = Runner(
        Options(phases=("outage", "unknown", "concurrency"), out=tmp_path / "BENCHMARKS.md", plan=RESILIENCE),
        Console(file=io.StringIO(), width=200),
    )
    report = runner.run()
    runner.finish()

    assert {s.key: s.error for s in report.sections} == {"outage": None, "unknown": None, "concurrency": None}
    figures = report.figures()
    tables = {s.key: [t.rows for t in s.tables] for s in report.sections}
    for key in RESILIENCE_KEYS:
        assert key in figures, f"missing figure {key}"
        assert figures[key].value is not None, f"figure {key} was not measured: {tables}"
    concurrency = next(s for s in report.sections if s.key == "concurrency")
    assert [row[0] for row in concurrency.tables[0].rows] == ["async", "sync"]
    markdown = (tmp_path / "BENCHMARKS.md").read_text()
    for title in ("Outage of a remote service", "Unknown outcomes", "Slow remotes with the worker's default pool"):
        assert f"## {title}" in markdown


# --- without a stack -----------------------------------------------------------------


def test_a_run_of_some_phases_keeps_the_other_phases_sections(tmp_path):
    old = tmp_path / "BENCHMARKS.md"
    old.write_text(
        "# Benchmarks\n\n## Machine\n\n| | |\n| --- | --- |\n| date | 2026-01-01 |\n| options | `--quick` |\n\n"
        "## Targets\n\n| figure | measured | target | met |\n| --- | ---: | ---: | :---: |\n"
        "| Idle cost: a figure | 1 | ≤ 2 | yes |\n| Pipeline throughput: ratio | 0.1 | ≥ 0.5 | **no** |\n\n"
        "## Idle cost\n\nthe idle figures\n\n## Pipeline throughput\n\nthe old pipeline\n"
    )
    write_soak_section(old, "## Chaos soak\n\nthe soak\n")
    kept = kept_sections(old, {"idle": "Idle cost", "sweep": "Supervisor sweep vs history"})
    assert [(s.key, s.kept_targets) for s in kept] == [("idle", ["| Idle cost: a figure | 1 | ≤ 2 | yes |"])]
    assert kept[0].kept.startswith("*Kept from an earlier run (2026-01-01, options `--quick`): not run this time.*")
    assert kept[0].kept.endswith("the idle figures")

    report = Report(machine={"date": "2026-02-02"}, options={})
    report.section("pipeline", "Pipeline throughput").figure("ratio", "ratio", 0.6, target="≥ 0.5", met=True)
    report.sections += kept
    old.write_text(report.to_markdown())
    markdown = old.read_text()
    assert "| Idle cost: a figure | 1 | ≤ 2 | yes |" in markdown
    assert "| Pipeline throughput: ratio | 0.600" in markdown
    assert "the old pipeline" not in markdown
    # Kept again: the line still names the run it was measured in, once.
    again = kept_sections(old, {"idle": "Idle cost"})[0].kept
    assert again.count("Kept from an earlier run") == 1 and "2026-01-01" in again


def _kind(kind: str, ms: float) -> ceiling.KindResult:
    return ceiling.KindResult(kind, ops=1000, seconds=ms)


def test_ceiling_adds_up_a_step_and_the_orders_fixed_part():
    results = {kind: _kind(kind, 1.0) for kind, *_ in ceiling.OPERATIONS}  # every operation 1 ms
    step = sum(ceiling.PER_STEP.values())
    fixed = sum(ceiling.PER_ORDER.values())
    assert (step, fixed) == (7, 10)
    assert ceiling.steps_per_second(results) == 1000 / step
    assert ceiling.orders_per_second(results) == 1000 / (fixed + STEPS * step)
    assert ceiling.order_steps_per_second(results) == STEPS * 1000 / (fixed + STEPS * step)
    del results["table.step"]
    assert ceiling.steps_per_second(results) is None


_TS = "2026-11-23T10:47:52.001Z"


def _request(rid: str, operation: str, url: str, status: int = 204, batch: list[tuple[str, str]] | None = None) -> str:
    lines = [
        f"{_TS} {rid} info: TableStorageContextMiddleware: RequestMethod=POST RequestURL={url} RequestHeaders:{{}}",
        f"{_TS} {rid} info: DispatchMiddleware: Operation={operation}",
    ]
    if batch is not None:
        parts = "".join(
            f"--changeset_1\\r\\nContent-ID: {i}\\r\\n\\r\\n"
            f"{method} http://127.0.0.1:1/devstoreaccount1/{target} HTTP/1.1\\r\\n\\r\\n{body}\\r\\n"
            for i, (method, target, body) in enumerate(batch)
        )
        lines.append(f'{_TS} {rid} debug: TableHandler:batch() Raw request string is "--batch_1\\r\\n{parts}"')
    lines.append(f"{_TS} {rid} info: EndMiddleware: End response. TotalTimeInMS=3 StatusCode={status} Headers={{}}")
    return "\n".join(lines)


def test_azurite_log_roles_tell_a_step_from_the_orders_fixed_part():
    base = "http://127.0.0.1/devstoreaccount1"
    insert_body = '{\\"PartitionKey\\": \\"o1\\", \\"RowKey\\": \\"%s\\"}'
    log = "\n".join([
        _request("r1", "Table_UpdateEntity", f"{base}/orders(PartitionKey='_active',RowKey='o1')"),
        _request("r2", "Table_Batch", f"{base}/$batch", 202, [
            ("POST", "orders", insert_body % "order"), ("POST", "orders", insert_body % "state"),
        ]),
        _request("r3", "Table_MergeEntity", f"{base}/orders(PartitionKey='o1',RowKey='state')"),
        *(
            _request(f"s{i}", "Table_Batch", f"{base}/$batch", 202, [
                ("PATCH", "orders(PartitionKey='o1',RowKey='state')", "{}"),
                ("PUT", f"orders(PartitionKey='o1',RowKey='step-0{i}-x')", "{}"),
            ])
            for i in (1, 2, 3)
        ),
        _request("r4", "Table_DeleteEntity", f"{base}/orders(PartitionKey='_active',RowKey='o1')"),
        _request("r5", "Table_QueryEntities", f"{base}/orders()?$filter=PartitionKey%20eq%20'_active'", 200),
        _request("r6", "Table_QueryEntitiesWithPartitionAndRowKey", f"{base}/orders(PartitionKey='o1',RowKey='state')",
                 200),
    ])
    operations = azurite_log.parse(log.encode())
    assert operations.by_role == {
        azurite_log.INDEX_UPSERT: 1, azurite_log.SUBMISSION: 1, azurite_log.STATE_MERGE: 1,
        azurite_log.STEP_TRANSACTION: 3, azurite_log.INDEX_DELETE: 1, azurite_log.INDEX_QUERY: 1,
        azurite_log.POINT_READ: 1,
    }
    assert operations.writes_by_role[azurite_log.STEP_TRANSACTION] == 6
    assert operations.writes_by_role[azurite_log.SUBMISSION] == 2
    assert azurite_log.INDEX_QUERY not in operations.writes_by_role
    assert operations.by_operation["Table_Batch"] == 4


def test_azurite_log_counts_no_request_of_its_own_marks():
    base = "http://127.0.0.1/devstoreaccount1"
    mark = f"{base}/{azurite_log.MARKER}0123456789abcdef(PartitionKey='mark',RowKey='mark')"
    log = "\n".join([
        _request("m1", "Table_QueryEntitiesWithPartitionAndRowKey", mark, 404),
        _request("r1", "Table_QueryEntitiesWithPartitionAndRowKey", f"{base}/orders(PartitionKey='o1',RowKey='state')",
                 200),
    ])
    operations = azurite_log.parse(log.encode())
    assert operations.by_role == {azurite_log.POINT_READ: 1}
    assert operations.by_status == {"Table_QueryEntitiesWithPartitionAndRowKey 200": 1}
    assert not operations.failed()
