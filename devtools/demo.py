"""``make demo``: the whole system on the local stack, with orders and faults.

Starts Azurite, the Service Bus emulator, the fake remote service (with a fault mix)
and local Functions hosts running ``function_app.py``; sends orders (a few invalid ones
among them) from a plain Service Bus client; shows live progress; stops when every
order is terminal or the time limit passes; prints a summary and writes a picture of
the run (``demo-output/run.png``) and the figures (``demo-output/summary.json``).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from azure.data.tables import TableClient
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from rich.console import Console
from rich.live import Live
from rich.table import Table

from adapters.store import StateStore
from core import names
from core.models import OrderState, ProcessState
from devtools.localstack import LocalStack
from devtools.orders import bad_order_body, load_bad_orders, order_message
from devtools.paths import ROOT
from devtools.stats import percentile

console = Console()
STATES = ("Pending", "Processing", "Processed", "Error")
_TERMINAL = (ProcessState.PROCESSED, ProcessState.ERROR)

#: Demo timings (app settings): short enough to watch recovery happen.
DEMO_SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "4",
    "PENDING_TIMEOUT_SECONDS": "4",
    "SUPERVISOR_SCHEDULE": "*/2 * * * * *",
    "RETRY_BACKOFF_BASE_SECONDS": "1",
    "RETRY_BACKOFF_MAX_SECONDS": "4",
    "MAX_FAILURES": "3",
    "AGENT_BACKOFF_INITIAL_SECONDS": "0.1",
    "AGENT_BACKOFF_MAX_SECONDS": "1",
    # Longer than a step: a response slower than the deadline is cut off by the
    # deadline, not by the call timeout, and the supervisor recovers the order.
    "REMOTE_CALL_TIMEOUT_SECONDS": "10",
}


@dataclass
class Sample:
    t: float
    counts: dict[str, int]
    resets: int
    alerts: int


@dataclass
class Summary:
    orders: int
    invalid_sent: int
    processed: int
    error: int
    rejected: int
    not_terminal: int
    agent_retries: int
    supervisor_resets: int
    alerts: int
    remote_effects: int
    effects_equal_processed: bool
    latency_p50_s: float | None
    latency_p95_s: float | None
    elapsed_s: float
    throughput_per_s: float
    samples: list[Sample] = field(default_factory=list, repr=False)


def send_orders(connection_string: str, orders: int, invalid: int, sent_at: dict[str, float]) -> None:
    """Send the orders (and a few bad messages from the corpus) like any client would.

    ``sent_at`` gets each order's submission time: when Service Bus accepted its batch.
    """
    bad = [case for case in load_bad_orders() if "generate" not in case][:invalid]
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender(names.ORDERS_QUEUE) as sender:
            batch: list[ServiceBusMessage] = []

            def flush() -> None:
                sender.send_messages(batch)
                accepted = time.time()
                sent_at.update({str(m.message_id): accepted for m in batch})
                batch.clear()

            for i in range(orders):
                order_id = f"demo-{i:05d}"
                batch.append(order_message(order_id, i))
                if len(batch) == 20:
                    flush()
                if i % 40 == 20 and bad:  # sprinkle the invalid ones among the valid
                    case = bad.pop()
                    sender.send_messages(
                        ServiceBusMessage(bad_order_body(case, f"bad-{i}"), message_id=f"bad-{i}",
                                          content_type=case.get("content_type", "application/json"))
                    )
            if batch:
                flush()
            for case in bad:
                sender.send_messages(ServiceBusMessage(bad_order_body(case), content_type=case.get("content_type", "application/json")))


def read_states(store: StateStore, prefix: str = "demo-") -> list[OrderState]:
    """The state of every order of the demo (one key-range query of the store)."""
    return store.list_states(id_prefix=prefix)


def progress_table(sample: Sample, orders: int, rejected: int, effects: int, started: float) -> Table:
    elapsed = time.monotonic() - started
    done = sample.counts["Processed"] + sample.counts["Error"]
    table = Table(title=f"Scheduler Agent Supervisor demo — {orders} orders, {elapsed:.0f} s", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    for state in STATES:
        table.add_row(state, str(sample.counts[state]))
    for key, value in (("rejected messages", rejected), ("supervisor resets", sample.resets),
                       ("alerts", sample.alerts), ("remote effects", effects)):
        table.add_row(key, str(value))
    table.add_row("orders/s", f"{done / max(elapsed, 0.001):.1f}")
    return table


def picture(samples: list[Sample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, ax = plt.subplots(figsize=(10, 5), dpi=110)
    colours = {"Pending": "#f2c14e", "Processing": "#5b8def", "Processed": "#3aa76d", "Error": "#d9534f"}
    ax.stackplot(t, *[[s.counts[state] for s in samples] for state in STATES], labels=STATES,
                 colors=[colours[s] for s in STATES], alpha=0.85)
    reset_times = [b.t for a, b in zip(samples, samples[1:]) if b.resets > a.resets]
    alert_times = [b.t for a, b in zip(samples, samples[1:]) if b.alerts > a.alerts]
    for x in reset_times:
        ax.axvline(x, color="#7a5195", alpha=0.35, linewidth=1)
    for x in alert_times:
        ax.axvline(x, color="#d9534f", linestyle="--", linewidth=1.5)
    ax.plot([], [], color="#7a5195", alpha=0.6, label="supervisor reset (retry)")
    ax.plot([], [], color="#d9534f", linestyle="--", label="alert (order in Error)")
    ax.set_xlabel("seconds since the first order was sent")
    ax.set_ylabel("orders")
    ax.set_title("Orders per state over time")
    ax.legend(loc="center right", fontsize=8)
    ax.margins(x=0)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_demo(
    orders: int, invalid: int, transient: float, slow: float, permanent: float, hosts: int,
    time_limit: float, out: Path, seed: int,
) -> Summary:
    out.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(
        settings=DEMO_SETTINGS,
        remote_rates={"transient": transient, "slow": slow, "permanent": permanent},
        remote_seed=seed,
        remote_slow_seconds=12.0,
        log_dir=out / "logs",
    )
    console.print(f"starting the local stack ({hosts} host(s))…")
    with stack.start(hosts=hosts):
        store = StateStore(TableClient.from_connection_string(stack.azurite.connection_string, names.ORDERS_TABLE))
        rejections = TableClient.from_connection_string(stack.azurite.connection_string, names.REJECTIONS_TABLE)
        console.print(f"sending {orders} orders and {invalid} invalid messages to the '{names.ORDERS_QUEUE}' queue…")
        started = time.monotonic()
        sent_at: dict[str, float] = {}
        sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="send-orders")
        sending = sender.submit(send_orders, stack.servicebus_connection_string, orders, invalid, sent_at)
        sender.shutdown(wait=False)
        samples: list[Sample] = []
        rows: list[OrderState] = []
        rejected = 0
        with Live(console=console, refresh_per_second=4) as live:
            while True:
                rows = read_states(store)
                counts = {state: 0 for state in STATES}
                for row in rows:
                    counts[row.process_state.value] += 1
                counts["Pending"] += len(sent_at) - len(rows)  # sent, not yet written
                rejected = sum(1 for _ in rejections.list_entities(select=["RowKey"])) if invalid else 0
                sample = Sample(
                    t=time.monotonic() - started,
                    counts=counts,
                    resets=sum(r.failure_count for r in rows),
                    alerts=counts["Error"],
                )
                samples.append(sample)
                live.update(progress_table(sample, orders, rejected, stack.remote.effects()["total"], started))
                terminal = counts["Processed"] + counts["Error"]
                if (terminal == orders and rejected >= invalid) or sample.t > time_limit:
                    break
                if sending.done() and sending.exception() is not None:
                    break
                time.sleep(0.5)
        elapsed = time.monotonic() - started
        sending.result()  # a failure to send is the demo's failure: raise it
        effects = stack.remote.effects()
        alerts = count_alerts(stack.servicebus_connection_string)
        latencies = sorted(
            r.updated_at.timestamp() - sent_at[r.order_id]
            for r in rows if r.process_state in _TERMINAL and r.order_id in sent_at
        )
        processed = sum(1 for r in rows if r.process_state is ProcessState.PROCESSED)
        summary = Summary(
            orders=orders,
            invalid_sent=invalid,
            processed=processed,
            error=sum(1 for r in rows if r.process_state is ProcessState.ERROR),
            rejected=rejected,
            not_terminal=orders - sum(1 for r in rows if r.process_state in _TERMINAL),
            agent_retries=sum(n for kind, n in effects["faults"].items() if kind not in ("permanent", "bad_request")),
            supervisor_resets=sum(r.failure_count for r in rows if r.process_state is ProcessState.PROCESSED)
            + sum(max(r.failure_count - 1, 0) for r in rows if r.process_state is ProcessState.ERROR),
            alerts=alerts,
            remote_effects=effects["total"],
            effects_equal_processed=effects["total"] == processed,
            latency_p50_s=_rounded(percentile(latencies, 50)),
            latency_p95_s=_rounded(percentile(latencies, 95)),
            elapsed_s=round(elapsed, 2),
            throughput_per_s=round((orders - (orders - len(latencies))) / elapsed, 2) if elapsed else 0.0,
            samples=samples,
        )
    return summary


def count_alerts(connection_string: str) -> int:
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver(names.ALERTS_QUEUE) as receiver:
            return len(receiver.peek_messages(max_message_count=1000))


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def print_summary(summary: Summary) -> None:
    table = Table(title="Summary", show_header=False)
    rows = [
        ("orders sent / invalid messages sent", f"{summary.orders} / {summary.invalid_sent}"),
        ("processed / error / rejected", f"{summary.processed} / {summary.error} / {summary.rejected}"),
        ("not terminal at the end", str(summary.not_terminal)),
        ("remote faults retried (503, slow, dropped...)", str(summary.agent_retries)),
        ("supervisor resets", str(summary.supervisor_resets)),
        ("alerts", str(summary.alerts)),
        ("remote effects vs processed", f"{summary.remote_effects} vs {summary.processed}"
         + (" (equal)" if summary.effects_equal_processed else " (NOT EQUAL)")),
        ("latency submission → terminal p50 / p95", f"{summary.latency_p50_s} s / {summary.latency_p95_s} s"),
        ("elapsed / throughput", f"{summary.elapsed_s} s / {summary.throughput_per_s} orders/s"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


def main(
    orders: Annotated[int, typer.Option(min=1, help="Valid orders to send.")] = 200,
    invalid: Annotated[int, typer.Option(min=0, help="Invalid messages (from the bad-input corpus) mixed in.")] = 5,
    transient: Annotated[float, typer.Option(min=0, max=1, help="Share of remote calls failing with 503.")] = 0.10,
    slow: Annotated[float, typer.Option(min=0, max=1, help="Share answered after the deadline (applied).")] = 0.03,
    permanent: Annotated[float, typer.Option(min=0, max=1, help="Share of orders the remote refuses (422).")] = 0.02,
    hosts: Annotated[int, typer.Option(min=1, max=4, help="Local Functions host processes.")] = 2,
    time_limit: Annotated[float, typer.Option(help="Stop waiting after this many seconds.")] = 300.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault draws.")] = 1,
    out: Annotated[Path, typer.Option(help="Where the picture, summary and logs go.")] = ROOT / "demo-output",
) -> None:
    """Run the whole system locally and send it orders."""
    try:
        summary = run_demo(orders, invalid, transient, slow, permanent, hosts, time_limit, out, seed)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: the local stack was stopped[/yellow]")
        raise typer.Exit(130)
    picture(summary.samples, out / "run.png")
    (out / "summary.json").write_text(
        json.dumps({k: v for k, v in asdict(summary).items() if k != "samples"}, indent=2) + "\n", encoding="utf-8"
    )
    print_summary(summary)
    console.print(f"picture: {out / 'run.png'}   figures: {out / 'summary.json'}   logs: {out / 'logs'}")
    if summary.not_terminal or not summary.effects_equal_processed:
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
