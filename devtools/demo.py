"""``make demo``: the whole system on the local stack, with orders and faults.

Starts Azurite, the Service Bus emulator, the fake remote services (inventory,
payments, shipping, each with a fault mix) and local Functions hosts running
``function_app.py``; sends orders (a few invalid ones among them) from a plain Service
Bus client. Every order runs the three steps (reserve, charge, ship), in sequence (the
workflow ``order``) or, for a share of them (``--parallel``), with reserve and charge at
once (``order-parallel``: a group, docs/workflows.md): most are
Processed, some are refused by payments or shipping and undone (Compensated), and a few
are scripted to end in Error (an undo that never answers in time, an undo that is
refused, a ship that never answers in time). It shows live progress, stops when every
order is in a final state or the time limit passes, then checks the outcome against
the remote services' effects (``devtools.stats.audit_effects``), prints a summary with each check
passed or failed, writes a picture of the run (``demo-output/run.png``) and the
figures (``demo-output/summary.json``), and exits 1 if a check failed.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from azure.data.tables import TableClient
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from rich.console import Console
from rich.live import Live
from rich.table import Table

from adapters.store import OrderRecord, StateStore
from core import names
from core.models import LineState, OrderState, ProcessState
from core.workflow import CURRENT, PARALLEL_WORKFLOW, Kind, remotes
from devtools.localstack import LocalStack
from devtools.orders import bad_order_message, load_bad_orders, order_message
from devtools.paths import ROOT
from devtools.stats import EFFECT_CHECKS, EffectsAudit, audit_effects, percentile

console = Console()
#: The final states, then the in-flight ones ("Undoing": Pending or Processing while
#: the order's steps are being undone).
FINAL = ("Processed", "Compensated", "Error")
IN_FLIGHT = ("Undoing", "Processing", "Pending")
STATES = FINAL + IN_FLIGHT
COLOURS = {"Processed": "#3aa76d", "Compensated": "#4f9fd6", "Error": "#d9534f",
           "Undoing": "#a17fd6", "Processing": "#f0a04b", "Pending": "#f2d16b"}

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
    # A remote service that keeps failing is left alone this long (its steps wait).
    "BREAKER_OPEN_SECONDS": "5",
}
#: The remote services that refuse some orders for good (``--permanent``).
REFUSING = ("payments", "shipping")
#: How the orders scripted to end in Error fail, in turn: (what happens, the fake
#: remote's script per service for that order). A script governs every call of its
#: order (or order/action) at that service, so the rates do not touch these orders.
#: Refusals are for good ("always:"), as a real service's are: an attempt whose answer
#: came too late (under load) runs again, and must be refused again.
ERROR_SCRIPTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("ship refused, then the refund never answers in time (it hangs, not applied) and gives up", {
        "inventory": lambda o: {o: ["ok"]},
        "payments": lambda o: {o: ["ok"], f"{o}/refund": ["always:hang"]},
        "shipping": lambda o: {o: ["always:permanent"]},
    }),
    ("charge refused, then the release is refused", {
        "inventory": lambda o: {o: ["ok"], f"{o}/release": ["always:permanent"]},
        "payments": lambda o: {o: ["always:permanent"]},
    }),
    ("ship never answers in time (slow, applied) and gives up, and a ship cannot be undone", {
        "inventory": lambda o: {o: ["ok"]},
        "payments": lambda o: {o: ["ok"]},
        "shipping": lambda o: {o: ["always:slow"]},
    }),
)  # fmt: skip


@dataclass
class Sample:
    t: float
    counts: dict[str, int]
    resets: int


@dataclass
class Check:
    check: str
    passed: bool
    detail: str = ""


@dataclass
class Summary:
    orders: int
    invalid_sent: int
    processed: int
    compensated: int
    error: int
    rejected: int
    not_terminal: int
    #: Remote faults the agents retried (503, 429, dropped connections, slow answers).
    agent_retries: int
    #: Lines run again after their deadline passed, and lines the supervisor gave up on.
    supervisor_resets: int
    supervisor_give_ups: int
    alerts: int
    #: Per service: forward actions applied, compensations that undid one, left applied.
    remote_effects: dict[str, dict[str, int]]
    #: Error order -> why, the undos that failed (from its alert), what it left applied.
    error_orders: dict[str, dict[str, Any]]
    #: Orders scripted to end in Error -> what was scripted.
    scripted_errors: dict[str, str]
    checks: list[Check]
    all_passed: bool
    latency_p50_s: float | None
    latency_p95_s: float | None
    #: Per workflow (``order``, ``order-parallel``): its orders, and the p50 / p95 latency of
    #: those that ended (submission → final state).
    by_workflow: dict[str, dict[str, Any]]
    elapsed_s: float
    throughput_per_s: float
    samples: list[Sample] = field(default_factory=list, repr=False)


def order_id(i: int) -> str:
    return f"demo-{i:05d}"


def scripted_errors(orders: int, errors: int) -> dict[str, int]:
    """Order id -> the index of its ERROR_SCRIPTS entry, spread over the run."""
    errors = min(errors, orders)
    return {order_id((k + 1) * orders // (errors + 1)): k % len(ERROR_SCRIPTS) for k in range(errors)}


def error_scripts(scripted: dict[str, int]) -> dict[str, dict[str, list[str]]]:
    """The fake remote's scripts, per service, for orders scripted to end in Error
    (order id -> the index of its ERROR_SCRIPTS entry)."""
    scripts: dict[str, dict[str, list[str]]] = {service: {} for service in remotes()}
    for oid, kind in scripted.items():
        for service, make in ERROR_SCRIPTS[kind][1].items():
            scripts[service].update(make(oid))
    return scripts


def demo_faults(transient: float, slow: float, permanent: float, scripted: dict[str, int]) -> dict[str, dict]:
    """The fake remote's faults, per service: rates everywhere (permanent refusals at
    payments and shipping only), and the scripts of the orders meant to end in Error."""
    scripts = error_scripts(scripted)
    faults: dict[str, dict] = {}
    for service in remotes():
        rates = {"transient": transient, "slow": slow, "permanent": permanent if service in REFUSING else 0}
        faults[service] = {"rates": {k: v for k, v in rates.items() if v}, "script": scripts[service]}
    return faults


def parallel_orders(orders: int, share: float, scripted: dict[str, int]) -> set[str]:
    """The orders that run on the parallel workflow: ``share`` of them, spread over the run
    (those scripted to end in Error run in sequence, as their scripts are written)."""
    if share <= 0:
        return set()
    every = max(1, round(1 / share))
    return {order_id(i) for i in range(orders) if i % every == every - 1 and order_id(i) not in scripted}


def send_orders(
    connection_string: str, orders: int, invalid: int, sent_at: dict[str, float], parallel: set[str] = frozenset()
) -> None:
    """Send the orders (and a few bad messages from the corpus) like any client would;
    those in ``parallel`` name the parallel workflow.

    ``sent_at`` gets each order's submission time: when Service Bus accepted its batch.
    """
    bad = [case for case in load_bad_orders() if "generate" not in case][:invalid]
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender(names.ORDERS_QUEUE) as sender:
            batch: list[ServiceBusMessage] = []

            def flush() -> None:
                sender.send_messages(batch)
                accepted = time.time()
                # MessageId is "{order id}:{body hash}" (docs/clients.md, "Sending orders").
                sent_at.update({str(m.message_id).rpartition(":")[0]: accepted for m in batch})
                batch.clear()

            for i in range(orders):
                chosen = PARALLEL_WORKFLOW.name if order_id(i) in parallel else None
                batch.append(order_message(order_id(i), i, chosen))
                if len(batch) == 20:
                    flush()
                if i % 40 == 20 and bad:  # sprinkle the invalid ones among the valid
                    sender.send_messages(bad_order_message(bad.pop(), f"bad-{i}"))
            if batch:
                flush()
            for case in bad:
                sender.send_messages(bad_order_message(case))


def read_states(store: StateStore, prefix: str = "demo-") -> list[OrderState]:
    """The state of every order of the demo (one key-range query of the store)."""
    return store.list_states(id_prefix=prefix)


def shown_state(state: OrderState) -> str:
    """The state as the demo shows it: in-flight orders being undone are "Undoing"."""
    if not state.process_state.terminal and state.kind is Kind.COMPENSATION:
        return "Undoing"
    return state.process_state.value


def progress_table(sample: Sample, orders: int, rejected: int, effects: dict, started: float) -> Table:
    elapsed = time.monotonic() - started
    done = sum(sample.counts[state] for state in FINAL)
    table = Table(title=f"Scheduler Agent Supervisor demo — {orders} orders, {elapsed:.0f} s", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    for state in (*reversed(IN_FLIGHT), *FINAL):
        table.add_row(state, str(sample.counts[state]))
    table.add_row("rejected messages", str(rejected))
    table.add_row("alerts (orders in Error)", str(sample.counts["Error"]))
    for service, figures in effects["services"].items():
        applied = sum(len(a) for a in figures["applied"].values())
        undone = sum(len(u) for u in figures["undone"].values())
        table.add_row(f"{service}: applied / undone", f"{applied} / {undone}")
    table.add_row("orders/s", f"{done / max(elapsed, 0.001):.1f}")
    return table


def picture(samples: list[Sample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    last = samples[-1].counts if samples else {state: 0 for state in STATES}
    fig, ax = plt.subplots(figsize=(11.5, 5), dpi=110)
    ax.stackplot(t, *[[s.counts[state] for s in samples] for state in STATES],
                 labels=[f"{state} ({last[state]})" if state in FINAL else state for state in STATES],
                 colors=[COLOURS[s] for s in STATES], alpha=0.85)
    reset_times = [b.t for a, b in zip(samples, samples[1:]) if b.resets > a.resets]
    alert_times = [b.t for a, b in zip(samples, samples[1:]) if b.counts["Error"] > a.counts["Error"]]
    for x in reset_times:
        ax.axvline(x, color="#7a5195", alpha=0.25, linewidth=1)
    for x in alert_times:
        ax.axvline(x, color="#d9534f", linestyle="--", linewidth=1.5)
    ax.plot([], [], color="#7a5195", alpha=0.6, label="supervisor reset (retry)")
    ax.plot([], [], color="#d9534f", linestyle="--", label="alert (order in Error)")
    ax.set_xlabel("seconds since the first order was sent")
    ax.set_ylabel("orders")
    ax.set_title("Orders per state over time: reserve → charge → ship, undone when refused")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    ax.margins(x=0)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def read_alerts(connection_string: str) -> list[dict]:
    """Every alert on the alerts queue, peeked (left there for an operator)."""
    found: list[dict] = []
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver(names.ALERTS_QUEUE) as receiver:
            sequence = 0
            while True:
                page = receiver.peek_messages(max_message_count=250, sequence_number=sequence)
                if not page:
                    return found
                found += [json.loads(b"".join(message.body)) for message in page]
                sequence = max(message.sequence_number for message in page) + 1


def read_records(store: StateStore, order_ids: list[str]) -> dict[str, OrderRecord]:
    """Every order's rows (its step rows say how often the supervisor stepped in)."""
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="read-orders") as pool:
        return dict(zip(order_ids, pool.map(store.read, order_ids)))


def build_checks(
    rows: list[OrderState], orders: int, invalid: int, rejected: int, audit: EffectsAudit, alerts: list[dict],
    scripted: dict[str, int],
) -> list[Check]:
    states = {row.order_id: row for row in rows}
    not_terminal = [order_id(i) for i in range(orders) if order_id(i) not in states
                    or not states[order_id(i)].process_state.terminal]
    checks = [Check("every order in a final state", not not_terminal,
                    f"{len(not_terminal)} not: {', '.join(not_terminal[:5])}" if not_terminal else f"{orders} orders")]
    for key, label in EFFECT_CHECKS.items():
        failed = {s: orders_ for s, orders_ in audit.problems[key].items() if orders_}
        detail = "; ".join(f"{s}: {', '.join(o[:4])}{' …' if len(o) > 4 else ''}" for s, o in failed.items())
        scope = f"{audit.checked[key]} {'calls' if key in ('twice', 'late') else 'orders'}"
        checks.append(Check(label, not failed, detail or f"{scope} at {', '.join(audit.services)}"))
    if audit.unknown_orders:
        checks.append(Check("effects only for orders of the run", False, ", ".join(audit.unknown_orders[:5])))
    errors = {row.order_id: row for row in rows if row.process_state is ProcessState.ERROR}
    per_order = Counter(alert["order_id"] for alert in alerts)
    wrong = sorted(o for o in set(per_order) | set(errors) if per_order.get(o, 0) != 1)
    steps = [step.name for step in CURRENT.steps]
    misnamed = sorted(
        alert["order_id"] for alert in alerts
        if alert["order_id"] in errors
        and alert.get("failed_compensations", []) != [steps[i] for i in errors[alert["order_id"]].failed]
    )
    checks.append(Check(
        "one alert per Error order, naming the undos that failed", not wrong and not misnamed,
        f"{len(alerts)} alerts, {len(errors)} Error orders"
        + (f"; not exactly one: {wrong[:5]}" if wrong else "")
        + (f"; wrong undos named: {misnamed[:5]}" if misnamed else ""),
    ))
    not_error = sorted(o for o in scripted if o in states and states[o].process_state is not ProcessState.ERROR)
    checks.append(Check(f"the {len(scripted)} orders scripted to fail end in Error", not not_error,
                        f"not Error: {not_error}" if not_error else ", ".join(scripted)))
    checks.append(Check("every invalid message rejected", rejected == invalid, f"{rejected} of {invalid}"))
    return checks


def run_demo(
    orders: int, invalid: int, transient: float, slow: float, permanent: float, errors: int, hosts: int,
    time_limit: float, out: Path, seed: int, parallel: float = 0.0,
) -> Summary:
    out.mkdir(parents=True, exist_ok=True)
    scripted = scripted_errors(orders, errors)
    grouped = parallel_orders(orders, parallel, scripted)
    stack = LocalStack(settings=DEMO_SETTINGS, remote_seed=seed, remote_slow_seconds=12.0, log_dir=out / "logs")
    console.print(f"starting the local stack ({hosts} host(s))…")
    with stack.start(hosts=hosts):
        for service, faults in demo_faults(transient, slow, permanent, scripted).items():
            stack.remote.set_faults(service=service, seed=seed, **faults)
        store = StateStore(TableClient.from_connection_string(stack.azurite.connection_string, names.ORDERS_TABLE))
        rejections = TableClient.from_connection_string(stack.azurite.connection_string, names.REJECTIONS_TABLE)
        console.print(f"sending {orders} orders and {invalid} invalid messages to the '{names.ORDERS_QUEUE}' queue…")
        started = time.monotonic()
        sent_at: dict[str, float] = {}
        sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="send-orders")
        sending = sender.submit(send_orders, stack.servicebus_connection_string, orders, invalid, sent_at, grouped)
        sender.shutdown(wait=False)
        samples: list[Sample] = []
        rows: list[OrderState] = []
        rejected = 0
        with Live(console=console, refresh_per_second=4) as live:
            while True:
                rows = read_states(store)
                counts = dict.fromkeys(STATES, 0)
                for row in rows:
                    counts[shown_state(row)] += 1
                counts["Pending"] += max(len(sent_at) - len(rows), 0)  # sent, not yet written
                # A body too large for one row continues in part rows (PartOf): not rejections.
                rejected = sum(
                    1 for row in rejections.list_entities(select=["RowKey", "PartOf"]) if not row.get("PartOf")
                ) if invalid else 0
                sample = Sample(t=time.monotonic() - started, counts=counts, resets=sum(r.failure_count for r in rows))
                samples.append(sample)
                live.update(progress_table(sample, orders, rejected, stack.remote.effects(), started))
                final = sum(counts[state] for state in FINAL)
                if (final == orders and rejected >= invalid) or sample.t > time_limit:
                    break
                if sending.done() and sending.exception() is not None:
                    break
                time.sleep(0.5)
        elapsed = time.monotonic() - started
        sending.result()  # a failure to send is the demo's failure: raise it
        effects = stack.remote.effects()
        alerts = read_alerts(stack.servicebus_connection_string)
        records = read_records(store, [row.order_id for row in rows])
    audit = audit_effects(rows, effects)
    resets, give_ups = _supervisor(records)
    latency = {
        r.order_id: r.updated_at.timestamp() - sent_at[r.order_id]
        for r in rows if r.process_state.terminal and r.order_id in sent_at
    }
    latencies = sorted(latency.values())
    by_workflow = {}
    for name in (CURRENT.name, PARALLEL_WORKFLOW.name):
        ran = [r for r in rows if r.workflow == name]
        ended = sorted(latency[r.order_id] for r in ran if r.order_id in latency)
        by_workflow[name] = {"orders": len(ran), "processed": sum(r.process_state is ProcessState.PROCESSED for r in ran),
                             "latency_p50_s": _rounded(percentile(ended, 50)),
                             "latency_p95_s": _rounded(percentile(ended, 95))}
    count = Counter(r.process_state for r in rows)
    alert_of = {alert["order_id"]: alert for alert in alerts}
    error_orders = {
        r.order_id: {
            "why": _why(r),
            "failed_compensations": alert_of.get(r.order_id, {}).get("failed_compensations"),
            "left_applied": audit.left_applied.get(r.order_id, []),
        }
        for r in sorted(rows, key=lambda r: r.order_id) if r.process_state is ProcessState.ERROR
    }
    checks = build_checks(rows, orders, invalid, rejected, audit, alerts, scripted)
    return Summary(
        orders=orders,
        invalid_sent=invalid,
        processed=count[ProcessState.PROCESSED],
        compensated=count[ProcessState.COMPENSATED],
        error=count[ProcessState.ERROR],
        rejected=rejected,
        not_terminal=orders - sum(count[s] for s in ProcessState if s.terminal),
        agent_retries=sum(n for kind, n in effects["faults"].items() if kind not in ("permanent", "bad_request")),
        supervisor_resets=resets,
        supervisor_give_ups=give_ups,
        alerts=len(alerts),
        remote_effects=audit.totals,
        error_orders=error_orders,
        scripted_errors={o: ERROR_SCRIPTS[kind][0] for o, kind in scripted.items()},
        checks=checks,
        all_passed=all(check.passed for check in checks),
        latency_p50_s=_rounded(percentile(latencies, 50)),
        latency_p95_s=_rounded(percentile(latencies, 95)),
        by_workflow=by_workflow,
        elapsed_s=round(elapsed, 2),
        throughput_per_s=round(len(latencies) / elapsed, 2) if elapsed else 0.0,
        samples=samples,
    )


def _supervisor(records: dict[str, OrderRecord]) -> tuple[int, int]:
    """(resets, give-ups) over every ended line: a line's failure count is how often its
    deadline passed; the last of them is a give-up when the line ran out of tries."""
    resets = give_ups = 0
    for record in records.values():
        for line in record.lines:
            gave_up = line.state is LineState.EXHAUSTED or (
                line.state is LineState.FAILED and (line.last_error or "").startswith("gave up")
            )
            give_ups += gave_up
            resets += line.failure_count - gave_up
    return resets, give_ups


def _why(state: OrderState) -> str:
    """Why an order is in Error, in a few words."""
    if state.kind is Kind.COMPENSATION:
        cause = (state.cause or state.last_error or "").split(": {", 1)[0]  # the remote's answer left out
        return f"undoing it, because {cause}"
    return f"step {state.step} gave up (outcome unknown) and cannot be undone"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def print_summary(summary: Summary) -> None:
    table = Table(title="Summary", show_header=False)
    rows = [
        ("orders sent / invalid messages sent", f"{summary.orders} / {summary.invalid_sent}"),
        ("Processed / Compensated / Error", f"{summary.processed} / {summary.compensated} / {summary.error}"),
        ("invalid messages rejected", str(summary.rejected)),
        ("not in a final state at the end", str(summary.not_terminal)),
        ("remote faults retried by the agents (503, slow...)", str(summary.agent_retries)),
        ("supervisor resets (deadline passed) / give-ups",
         f"{summary.supervisor_resets} / {summary.supervisor_give_ups}"),
        ("alerts", str(summary.alerts)),
        *((f"{service}: applied / undone / left applied", f"{e['applied']} / {e['undone']} / {e['left']}")
          for service, e in summary.remote_effects.items()),
        ("latency submission → final state p50 / p95", f"{summary.latency_p50_s} s / {summary.latency_p95_s} s"),
        *((f"  {name}: orders (Processed), p50 / p95",
           f"{w['orders']} ({w['processed']}), {w['latency_p50_s']} s / {w['latency_p95_s']} s")
          for name, w in summary.by_workflow.items() if w["orders"]),
        ("elapsed / throughput", f"{summary.elapsed_s} s / {summary.throughput_per_s} orders/s"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if summary.error_orders:
        errors = Table(title="Orders in Error (each alerted once): what an operator finds")
        for column in ("order", "undos that failed", "left applied", "why"):
            errors.add_column(column)
        for order, info in summary.error_orders.items():
            errors.add_row(order, ", ".join(info["failed_compensations"] or []) or "–",
                           ", ".join(info["left_applied"]) or "nothing", (info["why"] or "")[:80])
        console.print(errors)
    checks = Table(title="Checks")
    checks.add_column("check")
    checks.add_column("result")
    checks.add_column("detail")
    for check in summary.checks:
        checks.add_row(check.check, "[green]passed[/green]" if check.passed else "[red]FAILED[/red]", check.detail)
    console.print(checks)
    failed = [check for check in summary.checks if not check.passed]
    console.print("[green]all checks passed[/green]" if not failed else f"[red]{len(failed)} check(s) FAILED[/red]")


def main(
    orders: Annotated[int, typer.Option(min=1, help="Valid orders to send.")] = 200,
    invalid: Annotated[int, typer.Option(min=0, help="Invalid messages (from the bad-input corpus) mixed in.")] = 5,
    transient: Annotated[float, typer.Option(
        min=0, max=1, help="Share of calls failing with 503, at every service.")] = 0.10,
    slow: Annotated[float, typer.Option(
        min=0, max=1, help="Share of calls answered after the step's deadline (applied), at every service.")] = 0.03,
    permanent: Annotated[float, typer.Option(
        min=0, max=1, help="Share of calls payments and shipping refuse for good (422): the order is undone.")] = 0.03,
    errors: Annotated[int, typer.Option(
        min=0, help="Orders scripted to end in Error, in turn: a refund that never answers in time, "
        "a release refused, a ship that never answers in time.")] = 3,
    hosts: Annotated[int, typer.Option(min=1, max=4, help="Local Functions host processes.")] = 2,
    time_limit: Annotated[float, typer.Option(help="Stop waiting after this many seconds.")] = 300.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault draws.")] = 1,
    parallel: Annotated[float, typer.Option(
        min=0, max=1, help=f"Share of orders on {PARALLEL_WORKFLOW.name}: reserve and charge at once, then ship.")] = 0.25,
    out: Annotated[Path, typer.Option(help="Where the picture, summary and logs go.")] = ROOT / "demo-output",
) -> None:
    """Run the whole system locally, send it orders, and check the outcome."""
    if transient + slow + permanent > 1:
        raise typer.BadParameter("--transient, --slow and --permanent add up to more than 1")
    try:
        summary = run_demo(orders, invalid, transient, slow, permanent, errors, hosts, time_limit, out, seed, parallel)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: the local stack was stopped[/yellow]")
        raise typer.Exit(130)
    picture(summary.samples, out / "run.png")
    (out / "summary.json").write_text(
        json.dumps({k: v for k, v in asdict(summary).items() if k != "samples"}, indent=2) + "\n", encoding="utf-8"
    )
    print_summary(summary)
    console.print(f"picture: {out / 'run.png'}   figures: {out / 'summary.json'}   logs: {out / 'logs'}")
    if not summary.all_passed:
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
