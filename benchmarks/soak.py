"""Chaos soak: every failure mode at once, then an audit of the outcome.

``python -m benchmarks.soak --orders 1000`` (``make soak``); the test suite runs a short
form (150 orders). Two local hosts (so two supervisors), short step timeout and
supervisor period; remote faults by rate (transient, throttling, dropped
connections, responses slower than the deadline, permanent refusals); some order
messages sent twice; copies of real agent responses sent again; one host killed
(SIGKILL) and restarted mid-run. Then it checks:

- every order is terminal; nothing is left Pending or Processing;
- no order's effect applied twice; every Processed order has exactly one effect, and
  an effect outside them belongs only to an order whose retries ran out while its
  last answer was late (the effect happened, the answer was lost);
- every Error is a permanent refusal or an order that exhausted its retries, with
  exactly one alert each;
- no message is left in any queue but the dead-letter queues, and every dead-letter
  is explained;
- then, as the operator: with the faults cleared, every order that exhausted its
  retries is resubmitted (``ordersctl resubmit``) and ends Processed without a second
  effect, so remote effects == Processed orders.

The command writes its figures to the chaos soak section of ``BENCHMARKS.md``
(``--report``); ``make bench`` keeps that section when it rewrites the file.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from azure.data.tables import TableClient
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.storage.queue import QueueClient
from rich.console import Console

from adapters.store import StateStore
from benchmarks.machine import describe
from benchmarks.report import write_soak_section
from core import names
from core.models import OrderState, ProcessState
from devtools.localstack import LocalStack
from devtools.orders import order_message
from devtools.paths import ROOT

console = Console()

SOAK_SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "3",
    "PENDING_TIMEOUT_SECONDS": "3",
    "SUPERVISOR_SCHEDULE": "*/1 * * * * *",
    "RETRY_BACKOFF_BASE_SECONDS": "0.5",
    "RETRY_BACKOFF_MAX_SECONDS": "2",
    "MAX_FAILURES": "3",
    "AGENT_BACKOFF_INITIAL_SECONDS": "0.05",
    "AGENT_BACKOFF_MAX_SECONDS": "0.5",
    "REMOTE_CALL_TIMEOUT_SECONDS": "5",
    # The local host's own setting: a crashed host's storage-queue messages come back
    # after 15 s instead of the Functions host's 10-minute lease, so the audit sees them
    # handled within the run.
    "FUNCHOST_QUEUE_LEASE_SECONDS": "15",
}
#: The remote's faults, per call (permanent refusals are sticky per order).
SOAK_FAULTS = {"transient": 0.14, "throttle": 0.03, "drop": 0.03, "slow": 0.05, "permanent": 0.02}
_TERMINAL = (ProcessState.PROCESSED, ProcessState.ERROR)
#: Dead-letter reasons that have an explanation in this design.
EXPLAINED_DEAD_LETTERS = {"MaxDeliveryCountExceeded", "TTLExpiredException"}


@dataclass
class Verdict:
    orders: int
    processed: int
    errors: int
    error_permanent: int
    #: Orders in Error because their retries ran out (the operator resubmits them).
    exhausted: list[str]
    error_unexplained: list[str]
    not_terminal: list[str]
    remote_effects: int
    applied_twice: list[str]
    alerts_by_order: dict[str, int]
    duplicates_sent: int
    responses_replayed: int
    host_killed_at: float | None
    leftover: dict[str, int]
    dead_letters: dict[str, list[str]]
    elapsed_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    effects_on_exhausted: int = 0
    resubmitted: int = 0
    effects_after_resubmit: int | None = None
    processed_after_resubmit: int | None = None

    @property
    def error_exhausted(self) -> int:
        return len(self.exhausted)

    @property
    def ok(self) -> bool:
        return not self.problems


def _replay_responses(connection_string: str, queue: str, stop: threading.Event, share: float, rng: random.Random,
                      counter: Counter) -> None:
    """Send copies of real agent responses again (same body, same message id)."""
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver(queue) as peeker, client.get_queue_sender(queue) as sender:
            next_sequence = 0
            while not stop.is_set():
                try:
                    messages = peeker.peek_messages(max_message_count=50, sequence_number=next_sequence)
                except Exception:  # noqa: BLE001 - the peeker is best effort; the soak goes on
                    messages = []
                for message in messages:
                    next_sequence = max(next_sequence, message.sequence_number + 1)
                    if message.delivery_count == 0 and rng.random() < share and not (message.application_properties or {}).get(b"replayed"):
                        copy = ServiceBusMessage(b"".join(message.body), message_id=message.message_id,
                                                 content_type=message.content_type, correlation_id=message.correlation_id,
                                                 application_properties={"replayed": True})
                        sender.send_messages(copy)
                        counter["replayed"] += 1
                stop.wait(0.2)


def queue_leftovers(stack: LocalStack) -> tuple[dict[str, int], dict[str, list[str]]]:
    leftover: dict[str, int] = {}
    dead: dict[str, list[str]] = {}
    with ServiceBusClient.from_connection_string(stack.servicebus_connection_string) as client:
        for spec in names.SERVICEBUS_QUEUES:
            with client.get_queue_receiver(spec.name) as receiver:
                leftover[spec.name] = len(receiver.peek_messages(max_message_count=1000))
            with client.get_queue_receiver(spec.name, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
                reasons = [str(m.dead_letter_reason) for m in receiver.peek_messages(max_message_count=1000)]
                if reasons:
                    dead[spec.name] = reasons
    queue = QueueClient.from_connection_string(stack.azurite.connection_string, names.SCHEDULER_QUEUE)
    leftover[names.SCHEDULER_QUEUE] = queue.get_queue_properties().approximate_message_count
    return leftover, dead


def read_alerts(connection_string: str) -> Counter:
    alerts: Counter = Counter()
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver(names.ALERTS_QUEUE, max_wait_time=2) as receiver:
            while True:
                batch = receiver.receive_messages(max_message_count=100, max_wait_time=2)
                if not batch:
                    break
                for message in batch:
                    alerts[json.loads(str(message))["order_id"]] += 1
                    receiver.complete_message(message)
    return alerts


def run_soak(orders: int = 1000, *, seed: int = 7, time_limit: float = 600.0, duplicate_share: float = 0.1,
             replay_share: float = 0.1, kill_host: bool = True, out: Path = ROOT / "demo-output" / "soak") -> Verdict:
    rng = random.Random(seed)
    stack = LocalStack(settings=SOAK_SETTINGS, remote_rates=SOAK_FAULTS, remote_seed=seed,
                       remote_slow_seconds=8.0, log_dir=out / "logs")
    counter: Counter = Counter()
    started = time.monotonic()
    with stack.start(hosts=2):
        stop = threading.Event()
        replayer = threading.Thread(
            target=_replay_responses,
            args=(stack.servicebus_connection_string, names.AGENT_RESPONSES_QUEUE, stop, replay_share, rng, counter),
            daemon=True,
        )
        replayer.start()
        ids = [f"soak-{i:05d}" for i in range(orders)]
        store = StateStore(TableClient.from_connection_string(stack.azurite.connection_string, names.ORDERS_TABLE))
        duplicates = 0
        with ServiceBusClient.from_connection_string(stack.servicebus_connection_string) as client:
            with client.get_queue_sender(names.ORDERS_QUEUE) as sender:
                for start in range(0, orders, 50):
                    batch = []
                    for i in range(start, min(start + 50, orders)):
                        batch.append(order_message(ids[i], i))
                        if rng.random() < duplicate_share:  # the same order again, same message id
                            batch.append(order_message(ids[i], i))
                            duplicates += 1
                    sender.send_messages(batch)
        killed_at = None
        deadline = started + time_limit
        states: dict[str, OrderState] = {}
        while time.monotonic() < deadline:
            states = {state.order_id: state for state in store.list_states()}
            terminal = sum(1 for state in states.values() if state.process_state in _TERMINAL)
            if kill_host and killed_at is None and terminal >= orders * 0.4:
                # Crash one host mid-run (no draining), then bring a new one up.
                stack.kill_host(stack.hosts[0])
                killed_at = time.monotonic() - started
                console.print(f"killed host 1 at {killed_at:.1f} s ({terminal}/{orders} terminal); restarting it")
                stack.start_hosts(1)
            if terminal == orders:
                break
            time.sleep(0.5)
        stop.set()
        replayer.join(10)
        # Let the last delayed nudges and replayed responses arrive and be dropped. The
        # killed host's locked messages come back only when their locks expire.
        longest_lock = max(
            max(spec.lock_duration for spec in names.SERVICEBUS_QUEUES).total_seconds(),
            float(SOAK_SETTINGS["FUNCHOST_QUEUE_LEASE_SECONDS"]),
        )
        settle_deadline = time.monotonic() + 30
        if killed_at is not None:
            settle_deadline = max(settle_deadline, started + killed_at + longest_lock + 15)
        while time.monotonic() < settle_deadline:
            leftover, dead = queue_leftovers(stack)
            if not any(n for name, n in leftover.items() if name != names.ALERTS_QUEUE):
                break
            time.sleep(0.5)
        alerts = read_alerts(stack.servicebus_connection_string)
        effects = stack.remote.effects()
        leftover, dead = queue_leftovers(stack)
        verdict = _audit(orders, states, effects, alerts, duplicates, counter["replayed"], killed_at, leftover, dead)
        if not verdict.not_terminal:
            operator_phase(stack, store, verdict)
    verdict.elapsed_s = round(time.monotonic() - started, 1)
    return verdict


def operator_phase(stack: LocalStack, store: StateStore, verdict: Verdict) -> None:
    """Act as the operator: with the remote's faults cleared, resubmit every order that
    exhausted its retries. Each must end Processed, and the remote must see no second
    effect (the step keeps its idempotency key), so effects == Processed afterwards."""
    exhausted = verdict.exhausted
    stack.remote.set_faults()
    for order_id in exhausted:
        resubmitted = subprocess.run(
            [sys.executable, "-m", "ordersctl", "resubmit", order_id],
            cwd=ROOT, env={**os.environ, **stack.env}, capture_output=True, text=True, timeout=60,
        )
        if resubmitted.returncode != 0:
            verdict.problems.append(f"resubmit {order_id} failed: {resubmitted.stderr.strip()}")
    deadline = time.monotonic() + 60
    final: dict[str, OrderState] = {}
    while time.monotonic() < deadline:
        final = {o: store.get(o) for o in exhausted}
        if all(state.process_state is ProcessState.PROCESSED for state in final.values()):
            break
        time.sleep(0.5)
    effects = stack.remote.effects()
    processed = sum(1 for state in store.list_states() if state.process_state is ProcessState.PROCESSED)
    verdict.resubmitted = len(exhausted)
    verdict.effects_after_resubmit = effects["total"]
    verdict.processed_after_resubmit = processed
    if any(state.process_state is not ProcessState.PROCESSED for state in final.values()):
        verdict.problems.append(
            f"resubmitted orders not Processed: {[o for o, s in final.items() if s.process_state is not ProcessState.PROCESSED]}"
        )
    if effects["total"] != processed or any(n > 1 for n in effects["by_order"].values()):
        verdict.problems.append(f"after the operator's resubmits: remote effects {effects['total']} != processed {processed}")


def _audit(orders, states: dict[str, OrderState], effects, alerts, duplicates, replayed, killed_at, leftover,
           dead) -> Verdict:
    processed = [o for o, s in states.items() if s.process_state is ProcessState.PROCESSED]
    errors = {o: s for o, s in states.items() if s.process_state is ProcessState.ERROR}
    permanent = [o for o, s in errors.items() if "HTTP 422" in (s.last_error or "")]
    exhausted = [o for o, s in errors.items() if (s.last_error or "").startswith("gave up after")]
    unexplained = sorted(set(errors) - set(permanent) - set(exhausted))
    not_terminal = sorted(o for o, s in states.items() if s.process_state not in _TERMINAL)
    not_terminal += [f"soak-{i:05d} (never written)" for i in range(orders) if f"soak-{i:05d}" not in states]
    twice = sorted(o for o, n in effects["by_order"].items() if n > 1)
    v = Verdict(
        orders=orders, processed=len(processed), errors=len(errors), error_permanent=len(permanent),
        exhausted=exhausted, error_unexplained=unexplained, not_terminal=not_terminal,
        remote_effects=effects["total"], applied_twice=twice, alerts_by_order=dict(alerts),
        duplicates_sent=duplicates, responses_replayed=replayed, host_killed_at=killed_at,
        leftover=leftover, dead_letters=dead,
    )
    if not_terminal:
        v.problems.append(f"{len(not_terminal)} orders not terminal: {not_terminal[:5]}")
    # An effect belongs to a Processed order, or to an order whose last allowed attempt
    # was applied but answered after its deadline (retries exhausted, response lost).
    # A permanently refused order never has one.
    misplaced = {o: (states[o].process_state.value, states[o].last_error) if o in states else (None, None)
                 for o in effects["by_order"] if o not in processed and o not in exhausted}
    missing = [o for o in processed if effects["by_order"].get(o, 0) != 1]
    v.effects_on_exhausted = sum(1 for o in exhausted if effects["by_order"].get(o))
    if misplaced or missing:
        v.problems.append(f"remote effects do not match: on orders neither Processed nor exhausted {misplaced}; "
                          f"Processed without exactly one effect {missing[:5]}")
    if twice:
        v.problems.append(f"applied twice: {twice[:5]}")
    if unexplained:
        v.problems.append(f"Error without a permanent refusal or exhausted retries: {unexplained[:5]}")
    if set(alerts) != set(errors) or any(n != 1 for n in alerts.values()):
        wrong = {o: alerts.get(o, 0) for o in set(alerts) | set(errors) if alerts.get(o, 0) != 1}
        v.problems.append(f"alerts are not exactly one per Error order: {dict(list(wrong.items())[:5])}")
    stuck = {name: n for name, n in leftover.items() if n and name != names.ALERTS_QUEUE}
    if stuck:
        v.problems.append(f"messages left in queues: {stuck}")
    unexplained_dead = {q: r for q, r in dead.items() if set(r) - EXPLAINED_DEAD_LETTERS}
    if unexplained_dead:
        v.problems.append(f"dead-letters without an explained reason: {unexplained_dead}")
    return v


def print_verdict(v: Verdict) -> None:
    console.print(f"orders {v.orders}: processed {v.processed}, error {v.errors} "
                  f"(permanent {v.error_permanent}, retries exhausted {v.error_exhausted}), "
                  f"not terminal {len(v.not_terminal)}")
    console.print(f"operator resubmitted {v.resubmitted} exhausted orders ({v.effects_on_exhausted} had their effect "
                  f"applied but answered late): then {v.processed_after_resubmit} processed, "
                  f"{v.effects_after_resubmit} remote effects")
    console.print(f"remote effects {v.remote_effects} (applied twice: {len(v.applied_twice)}); "
                  f"alerts {sum(v.alerts_by_order.values())} for {len(v.alerts_by_order)} orders")
    console.print(f"chaos: {v.duplicates_sent} duplicate order messages, {v.responses_replayed} replayed agent responses, "
                  f"host killed at {v.host_killed_at if v.host_killed_at is None else round(v.host_killed_at, 1)} s")
    console.print(f"queues left: {v.leftover}; dead-letters: { {q: Counter(r) for q, r in v.dead_letters.items()} }")
    console.print(f"elapsed {v.elapsed_s} s — " + ("[green]all checks passed[/green]" if v.ok else
                                                     "[red]FAILED: " + "; ".join(v.problems) + "[/red]"))


def verdict_markdown(v: Verdict, *, seed: int, machine: dict[str, str]) -> str:
    """The soak's section of ``BENCHMARKS.md``."""
    killed = "not killed" if v.host_killed_at is None else f"killed (SIGKILL) at {v.host_killed_at:.1f} s and restarted"
    dead = "; ".join(
        f"{queue}: " + ", ".join(f"{reason} {n}" for reason, n in Counter(reasons).items())
        for queue, reasons in v.dead_letters.items() if reasons
    )
    rows = [
        ("orders", v.orders, "every one terminal"),
        ("Processed", v.processed, ""),
        ("Error: permanent refusals", v.error_permanent, "each with one alert"),
        ("Error: retries exhausted", v.error_exhausted, "each with one alert"),
        ("Error: unexplained", len(v.error_unexplained), "must be 0"),
        ("not terminal (Pending or Processing)", len(v.not_terminal), "must be 0"),
        ("alerts (orders alerted)", f"{sum(v.alerts_by_order.values())} ({len(v.alerts_by_order)})", "= Error orders"),
        ("remote effects", v.remote_effects, "Processed + exhausted orders whose last answer was late"),
        ("remote effects applied twice", len(v.applied_twice), "must be 0"),
        ("exhausted orders with their effect applied (late answer)", v.effects_on_exhausted, ""),
        ("operator resubmits (exhausted orders)", v.resubmitted, "faults cleared first"),
        ("Processed after the resubmits", v.processed_after_resubmit, ""),
        ("remote effects after the resubmits", v.effects_after_resubmit, "= Processed, none twice"),
        ("duplicate order messages sent", v.duplicates_sent, ""),
        ("agent responses replayed", v.responses_replayed, ""),
        ("messages left in queues (alerts aside)", sum(n for q, n in v.leftover.items() if q != names.ALERTS_QUEUE),
         "must be 0"),
        ("dead-lettered, by reason", dead or "none", "only expired or over-delivered messages"),
        ("elapsed", f"{v.elapsed_s} s", ""),
    ]
    faults = ", ".join(f"{kind} {rate:.0%}" for kind, rate in SOAK_FAULTS.items())
    settings = ", ".join(f"`{k}={v_}`" for k, v_ in SOAK_SETTINGS.items())
    lines = [
        "## Chaos soak",
        "",
        f"`make soak` (`python -m benchmarks.soak --orders {v.orders} --seed {seed}`), {machine['date']}, "
        f"{machine['cores']} cores ({machine['cpu']}), Python {machine['python']}: two local hosts (two supervisors), "
        f"host 1 {killed}; remote faults per call: {faults} (transient, throttle and drop are the "
        f"transient faults; slow answers after the step's deadline, a lost response); settings: {settings}.",
        "",
        "**Result: " + ("all checks passed" if v.ok else "FAILED: " + "; ".join(v.problems)) + "**",
        "",
        "| | value | check |",
        "| --- | ---: | --- |",
        *(f"| {label} | {value} | {check} |" for label, value, check in rows),
    ]
    return "\n".join(lines) + "\n"


def main(
    orders: Annotated[int, typer.Option(min=1)] = 1000,
    seed: Annotated[int, typer.Option()] = 7,
    time_limit: Annotated[float, typer.Option()] = 900.0,
    report: Annotated[Path, typer.Option(help="Write the figures to this report's chaos soak section.",
                                         show_default="BENCHMARKS.md")] = (
        ROOT / "BENCHMARKS.md"
    ),
) -> None:
    """Run the chaos soak and audit the outcome (exit 1 if any check fails)."""
    machine = describe()
    verdict = run_soak(orders, seed=seed, time_limit=time_limit)
    print_verdict(verdict)
    write_soak_section(report, verdict_markdown(verdict, seed=seed, machine=machine))
    console.print(f"figures written to the chaos soak section of {report.name}")
    raise typer.Exit(0 if verdict.ok else 1)


if __name__ == "__main__":
    typer.run(main)
