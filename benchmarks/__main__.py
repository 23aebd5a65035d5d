"""``python -m benchmarks [--quick] [--phases ceiling,sweep,...] [--sweep-100k] [--out BENCHMARKS.md] [--operations-out FILE]``

With ``--phases``, the report keeps the sections of the phases not run as the last one had them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from benchmarks.capacity import OPERATIONS_FILE
from benchmarks.runner import PHASES, Options, Runner
from devtools.paths import ROOT


def main(
    quick: Annotated[bool, typer.Option(help="A ~5-minute smoke run: fewer operations and orders, shorter windows.")] = False,
    phases: Annotated[str, typer.Option(
        help=f"Comma-separated phases to run, of: {', '.join(PHASES)}; the report keeps the others' sections."
    )] = ",".join(PHASES),
    sweep_100k: Annotated[bool, typer.Option(help="Add the 100,000 finished orders step to the sweep (~13 more minutes).")] = False,
    out: Annotated[Path, typer.Option(help="Where to write the report (Markdown).")] = ROOT / "BENCHMARKS.md",
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write every figure as JSON here.")] = None,
    operations_out: Annotated[Path | None, typer.Option(
        help="Where the ops phase writes the operation counts per order the capacity model reads "
        "(python -m benchmarks.capacity).")] = OPERATIONS_FILE,
    keep_logs: Annotated[bool, typer.Option(help="Keep the stacks' logs (printed at the end).")] = False,
) -> None:
    """Benchmark the app on the local stack: ceiling, pipeline, latency, operations, sweep, recovery, idle,
    outage, unknown outcomes, worker concurrency."""
    chosen = tuple(p.strip() for p in phases.split(",") if p.strip())
    unknown = [p for p in chosen if p not in PHASES]
    if unknown:
        raise typer.BadParameter(f"unknown phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    console = Console()
    runner = Runner(
        Options(quick=quick, phases=chosen, sweep_100k=sweep_100k, out=out, json_out=json_out,
                operations_out=operations_out, keep_logs=keep_logs),
        console,
    )
    try:
        report = runner.run()
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: the local stacks were stopped[/yellow]")
        raise typer.Exit(130)
    report.print(console)
    runner.finish()
    console.print(f"report written to {out}")
    if any(section.error for section in report.sections):
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
