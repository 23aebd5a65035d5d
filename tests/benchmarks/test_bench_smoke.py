"""Smoke test of ``make bench``: the cheapest phases in their smallest form, on a real
local stack (Azurite and the Service Bus emulator). Checks the report's shape only:
speed is reported, never asserted."""

from __future__ import annotations

import io
import json

from rich.console import Console

from benchmarks.report import write_soak_section
from benchmarks.runner import Options, Plan, Runner

SMALL = Plan(
    serial_ops=20, parallel=(2, 2), parallel_ops=80, op_budget=2.0, study=((1, 1), (2, 1)), study_ops=40,
    transport_reads=40, sweep_history=(0, 1000), sweep_repeats=2,
)

CEILING_KEYS = [
    "ceiling.orders_per_s",
    "ceiling.orders_per_s_serial",
    "ceiling.cpu_ms_per_order",
    "ceiling.cpu_bound_orders_per_s",
    "ceiling.update_ops_per_s.1x1",
    "ceiling.update_ops_per_s.2x1",
    "ceiling.transport_gain_pct",
]
SWEEP_KEYS = ["sweep.sweep_ms.0", "sweep.sweep_ms.1000", "sweep.naive_ms.0", "sweep.naive_ms.1000", "sweep.ratio"]
OPERATIONS = [
    "table insert-transaction", "table point read", "table If-Match MERGE update", "table upsert", "table delete",
    "storage queue send", "storage queue receive", "storage queue delete", "Service Bus send", "Service Bus receive",
    "Service Bus complete",
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

    sweep_table = report.sections[1].tables[0]
    assert [row[0] for row in sweep_table.rows] == ["0", "1,000"]
    assert all("read 100" in row[-1] and "index_query 1" in row[-1] for row in sweep_table.rows)

    markdown = out.read_text()
    for heading in ("# Benchmarks", "## Machine", "## Targets", "## Ceiling: raw operations", "## Supervisor sweep vs history"):
        assert heading in markdown
    assert "sweep(1,000) / sweep(0)" in markdown
    assert "an older run" not in markdown
    assert markdown.count("## Chaos soak") == 1 and "the last soak's figures" in markdown, "the soak's section was lost"
    assert json.loads(raw.read_text())["sections"][0]["key"] == "ceiling"
