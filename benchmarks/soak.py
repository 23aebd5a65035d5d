"""Chaos soak: every failure mode at once on the three-step workflow, then an audit.

``python -m benchmarks.soak --orders 1000`` (``make soak``); the test suite runs a short
form (150 orders). Every order runs reserve@inventory, charge@payments, ship@shipping.
Two local hosts (so two supervisors), a short step timeout and supervisor period;
faults at every remote service by rate (transient, throttling, dropped connections,
responses slower than the deadline; permanent refusals, which make orders undo
themselves, and hit compensations too), so the agents' circuit breakers open now and
then; a few orders scripted to end in Error (a refund that never answers in time, a
release refused, a ship never answered in time); some order messages sent twice;
copies of real agent responses sent again; one host killed (SIGKILL) and restarted
mid-run. Then it checks:

- every order is in a final state (Processed, Compensated or Error);
- the remote services' effects match every final state, per service
  (``devtools.stats.audit_effects``): a Processed order has each action applied once
  and nothing undone, a Compensated order has every applied action undone (net 0), an
  Error order leaves nothing applied but the undos that failed (or the stopped step);
- nothing applied twice (``twice == 0``), no call after its ``Complete-By``;
- every Error order has exactly one alert, naming the undos that failed;
- nothing is left on any queue (the scheduler's poison queue included), nothing is
  dead-lettered;
- then, as the operator: with the faults cleared, every Error order is resubmitted
  (``ordersctl resubmit``) and ends Compensated (its failed undos done) or Processed
  (its stopped step done), with the effects still consistent and no new alert.

The command writes its figures to the chaos soak section of ``BENCHMARKS.md``
(``--report``); ``make bench`` keeps that section when it rewrites the file.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated

import typer
from azure.data.tables import TableClient
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import ServiceBusError
from azure.storage.queue import QueueClient
from rich.console import Console

from adapters.store import StateStore
from benchmarks.machine import describe
from benchmarks.misses import ANSWERED_IN_TIME_RECORDED_LATE
from benchmarks.misses import classify as classify_misses
from benchmarks.report import SOAK_BEGIN, SOAK_END, write_soak_section
from core import names
from core.models import OrderState, ProcessState
from core.workflow import CURRENT, Kind, remotes
from devtools.demo import ERROR_SCRIPTS, error_scripts, read_alerts
from devtools.localstack import (
    SERVICEBUS_FAULTS_HELP,
    STORAGE_FAULTS_HELP,
    LocalStack,
    ServiceBusFaults,
    servicebus_faults_option,
    storage_faults_option,
)
from devtools.orders import order_message
from devtools.paths import ROOT
from devtools.stats import EFFECT_CHECKS, EffectsAudit, audit_effects
from tools.servicebus_emulator import QueueSettings
from tools.storage_faults import KINDS as STORAGE_FAULT_KINDS
from tools.storage_faults import StorageFaults

console = Console()

#: With Service Bus push-back on, a step's deadline must outlast the Service Bus SDK's own
#: retries of a throttled or dropped send (1 + 2 + 4 s, adapters/clients.py) and a lost
#: lock's redelivery, or the push-back turns into missed deadlines and undos: as the
#: production default (30 s) does. Measured: 3 s ended 59 of 300 orders in Error, 12 s 3
#: (the scripted ones), as without faults (docs/scale.md). And an answer sent before the
#: deadline is awaited past it while the responses queue still holds older messages, up to
#: RESPONSE_GRACE_SECONDS: with both kinds of push-back on, the hosts' own backlog held the
#: agents' responses 10-60 s in the responses queue (every one of the 65 unscripted Error
#: orders of a 1,000-order run without it: docs/scale.md, "The soak under push-back").
SERVICEBUS_PUSHBACK_SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "12", "PENDING_TIMEOUT_SECONDS": "12", "RESPONSE_GRACE_SECONDS": "90",
}

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
    # after 8 s instead of the Functions host's 10-minute lease, so the audit sees them
    # handled within the run.
    "FUNCHOST_QUEUE_LEASE_SECONDS": "8",
    # A remote service that keeps failing is left alone this long (its steps wait,
    # postponed): short, so a breaker that opens on a run of faults costs seconds.
    "BREAKER_OPEN_SECONDS": "2",
}
#: The Service Bus lock duration of the soak's queues (60 s in Azure and in the other
#: runs): a crashed host's locked messages come back after this long. The hosts renew
#: the locks of the messages they are handling at half-life, as in Azure.
SOAK_LOCK_SECONDS = 8.0
#: Transport faults, per call, at every service.
_TRANSPORT = {"transient": 0.12, "throttle": 0.03, "drop": 0.03, "slow": 0.04}
#: The remote services' faults, per call. A permanent refusal is sticky per order (and
#: per kind: a refused action does not refuse its order's compensations, which are
#: drawn on their own and can be refused too).
SOAK_FAULTS: dict[str, dict[str, float]] = {
    "inventory": {**_TRANSPORT, "permanent": 0.01},
    "payments": {**_TRANSPORT, "permanent": 0.02},
    "shipping": {**_TRANSPORT, "permanent": 0.02},
}
_FINAL = (ProcessState.PROCESSED, ProcessState.COMPENSATED, ProcessState.ERROR)


@dataclass
class Verdict:
    orders: int
    processed: int
    #: Compensated because a step was refused / because a step gave up.
    compensated_refused: int
    compensated_gave_up: int
    #: Error because an undo failed / because a step that cannot be undone gave up.
    error_undo_failed: int
    error_stopped: int
    #: Orders scripted to end in Error -> what was scripted.
    scripted: dict[str, str]
    not_terminal: list[str]
    audit: EffectsAudit
    alerts_by_order: dict[str, int]
    #: Error orders whose alert does not name the undos that failed.
    alerts_misnamed: list[str]
    duplicates_sent: int
    responses_replayed: int
    host_killed_at: float | None
    leftover: dict[str, int]
    dead_letters: dict[str, list[str]]
    elapsed_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    resubmitted: int = 0
    #: Final states of the resubmitted orders, and the audit of every order afterwards.
    after_resubmit: dict[str, int] = field(default_factory=dict)
    audit_after_resubmit: EffectsAudit | None = None
    alerts_after_resubmit: int = 0
    #: Circuit breaker openings per remote service, and lines postponed meanwhile (host logs).
    breaker_opened: dict[str, int] = field(default_factory=dict)
    postponed: int = 0
    #: Seconds from the start to the end of each phase (stack up, all final, settled, operator).
    phases: dict[str, float] = field(default_factory=dict)
    #: Azure's push-back injected (tools/storage_faults): the rates, and the proxy's counts
    #: (requests per service, faults by kind); empty without it.
    storage_faults: str | None = None
    fault_counts: dict = field(default_factory=dict)
    #: Writes answered as failed (412/409 on the SDK's retry, or no answer) that the hosts
    #: found applied by their write id, by kind (``write``, ``create``), from the host logs.
    recognised: dict[str, int] = field(default_factory=dict)
    #: Service Bus faults the emulator injected, by kind (--servicebus-faults; empty without).
    servicebus_faults: dict[str, int] = field(default_factory=dict)
    #: The machine's 1-minute load average when the orders were sent and when all were final
    #: (the development machine is shared: its load moves the throughput more than the faults).
    load_average: dict[str, float] = field(default_factory=dict)
    #: Missed deadlines the supervisor counted, by verdict (retry, give_up) and cause, from the
    #: hosts' spans (benchmarks/misses.py): one answered in time but recorded late is the app's
    #: own plumbing, not the remote's failure.
    misses: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def pushback(self) -> bool:
        """Ran with any of Azure's push-back injected (storage or Service Bus)."""
        return bool(self.storage_faults or self.servicebus_faults)

    @property
    def compensated(self) -> int:
        return self.compensated_refused + self.compensated_gave_up

    @property
    def errors(self) -> int:
        return self.error_undo_failed + self.error_stopped

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def orders_per_second(self) -> float:
        """Orders brought to a final state per second, from the first order sent to the last final."""
        seconds = self.phases.get("all final", 0) - self.phases.get("stack up", 0)
        return round(self.orders / seconds, 2) if seconds > 0 else 0.0


def soak_id(i: int) -> str:
    return f"soak-{i:05d}"


def scripted_errors(orders: int) -> dict[str, int]:
    """Order id -> its ERROR_SCRIPTS entry: about 1% of the orders, at least one of each
    kind, spread over the first fifth of the run (their retries take a while: they
    overlap the rest of it)."""
    count = min(orders, max(len(ERROR_SCRIPTS), orders // 100))
    return {soak_id((k + 1) * max(orders // 5, count) // (count + 1)): k % len(ERROR_SCRIPTS) for k in range(count)}


class SoakStack(LocalStack):
    """The local stack with the soak's short Service Bus lock duration."""

    def _emulator_queues(self) -> list[QueueSettings]:
        return [replace(queue, lock_duration=SOAK_LOCK_SECONDS) for queue in super()._emulator_queues()]


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
                stop.wait(0.5)


def _send_until_accepted(sender, batch: list[ServiceBusMessage], attempts: int = 10) -> None:
    """Send, again after what the SDK's own retries could not get through (a throttled namespace,
    with --servicebus-faults); a send applied before its connection dropped is dropped as a duplicate
    (the orders queue detects them by message id)."""
    for attempt in range(attempts):
        try:
            sender.send_messages(batch)
            return
        except ServiceBusError:
            if attempt == attempts - 1:
                raise


def queue_leftovers(stack: LocalStack) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Messages on every queue (locked, scheduled and leased ones included), and the
    dead-lettered ones' reasons, per queue. The queues are looked at in parallel."""

    def servicebus(spec: names.ServiceBusQueueSpec) -> tuple[str, int, list[str]]:
        with ServiceBusClient.from_connection_string(stack.servicebus_connection_string) as client:
            with client.get_queue_receiver(spec.name) as receiver:
                count = len(receiver.peek_messages(max_message_count=1000))
            with client.get_queue_receiver(spec.name, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
                reasons = [str(m.dead_letter_reason) for m in receiver.peek_messages(max_message_count=1000)]
        return spec.name, count, reasons

    def storage(queue_name: str) -> tuple[str, int, list[str]]:
        queue = QueueClient.from_connection_string(stack.azurite.connection_string, queue_name)
        return queue_name, queue.get_queue_properties().approximate_message_count, []

    storage_queues = [q for name, _ in names.STORAGE_QUEUES for q in (name, name + names.POISON_SUFFIX)]
    with ThreadPoolExecutor(max_workers=len(names.SERVICEBUS_QUEUES) + len(storage_queues)) as pool:
        found = [pool.submit(servicebus, spec) for spec in names.SERVICEBUS_QUEUES]
        found += [pool.submit(storage, name) for name in storage_queues]
        results = [future.result() for future in found]
    return {name: count for name, count, _ in results}, {name: reasons for name, _, reasons in results if reasons}


def _busy(leftover: dict[str, int]) -> bool:
    return any(n for name, n in leftover.items() if name != names.ALERTS_QUEUE)


def run_soak(orders: int = 1000, *, seed: int = 7, time_limit: float = 600.0, duplicate_share: float = 0.1,
             replay_share: float = 0.1, kill_host: bool = True, out: Path = ROOT / "demo-output" / "soak",
             storage_faults: StorageFaults | None = None, servicebus_faults: ServiceBusFaults | None = None,
             operator: bool = True) -> Verdict:
    """``storage_faults``: Azure Storage's push-back between the hosts (and the operator's
    ``ordersctl``) and Azurite, from the moment the hosts are up (their start-up goes through
    the proxy unharmed: what the soak checks is the orders under push-back); the soak's own
    audit reads Azurite directly.
    ``servicebus_faults``: the emulator's throttling, lost locks and dropped links; the
    steps' deadlines then outlast the Service Bus SDK's retries (SERVICEBUS_PUSHBACK_SETTINGS)."""
    rng = random.Random(seed)
    scripted = scripted_errors(orders)
    settings = {**SOAK_SETTINGS, **(SERVICEBUS_PUSHBACK_SETTINGS if servicebus_faults else {})}
    stack = SoakStack(settings=settings, remote_seed=seed, remote_slow_seconds=8.0, log_dir=out / "logs",
                      storage_faults=None if storage_faults is None else StorageFaults(), storage_faults_seed=seed,
                      servicebus_faults=servicebus_faults)
    counter: Counter = Counter()
    started = time.monotonic()
    phases: dict[str, float] = {}

    load: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - started, 1)
        if name in ("stack up", "all final"):
            load[name] = round(os.getloadavg()[0], 1)

    with stack.start(hosts=2):
        if storage_faults is not None:
            stack.set_storage_faults(storage_faults)  # the proxy started with none: the hosts are up
        phase("stack up")
        scripts = error_scripts(scripted)
        for service in remotes():
            stack.remote.set_faults(service=service, rates=SOAK_FAULTS[service], script=scripts[service], seed=seed)
        stop = threading.Event()
        replayer = threading.Thread(
            target=_replay_responses,
            args=(stack.servicebus_connection_string, names.AGENT_RESPONSES_QUEUE, stop, replay_share, rng, counter),
            daemon=True,
        )
        replayer.start()
        ids = [soak_id(i) for i in range(orders)]
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
                    _send_until_accepted(sender, batch)
        killed_at = None
        deadline = started + time_limit
        states: dict[str, OrderState] = {}
        while time.monotonic() < deadline:
            states = {state.order_id: state for state in store.list_states(id_prefix="soak-")}
            final = sum(1 for state in states.values() if state.process_state.terminal)
            if kill_host and killed_at is None and final >= orders * 0.3:
                # Crash one host mid-run (no draining), then bring a new one up.
                stack.kill_host(stack.hosts[0])
                killed_at = time.monotonic() - started
                console.print(f"killed host 1 at {killed_at:.1f} s ({final}/{orders} in a final state); restarting it")
                stack.start_hosts(1)
            if final == orders:
                break
            time.sleep(1.0)  # the fake remote serves from this process: leave it the CPU
        phase("all final")
        stop.set()
        replayer.join(10)
        # Once every order is final nothing new starts: wait until no message is left on
        # any queue and no remote call is in flight (the last delayed nudges and replayed
        # responses are handled and dropped). The killed host's locked and leased
        # messages count until their locks expire and they are handled again.
        settle_deadline = time.monotonic() + 30
        if killed_at is not None:
            settle_deadline = max(settle_deadline, started + killed_at + SOAK_LOCK_SECONDS + 30)
        while True:
            calls_in_flight = stack.remote.effects()["in_flight"]
            if not calls_in_flight or time.monotonic() > settle_deadline:
                leftover, dead = queue_leftovers(stack)
                if not _busy(leftover) or time.monotonic() > settle_deadline:
                    break
            time.sleep(0.5)
        phase("settled")
        alerts = read_alerts(stack.servicebus_connection_string)
        effects = stack.remote.effects()
        states = {state.order_id: state for state in store.list_states(id_prefix="soak-")}
        verdict = _audit(orders, states, effects, alerts, scripted, duplicates, counter["replayed"], killed_at,
                         leftover, dead)
        verdict.breaker_opened, verdict.postponed = breaker_figures(stack.host_logs)
        verdict.recognised = recognised_writes(stack.host_logs)
        verdict.servicebus_faults = stack.servicebus_fault_counts()
        verdict.misses = classify_misses(out / "logs", float(settings["STEP_TIMEOUT_SECONDS"]))
        if operator and not verdict.not_terminal:
            errors = [o for o, s in states.items() if s.process_state is ProcessState.ERROR]
            operator_phase(stack, store, verdict, errors)
            phase("operator done")
        verdict.phases = phases
        verdict.load_average = load
        verdict.storage_faults = storage_faults.to_arg() if storage_faults is not None else None
        verdict.fault_counts = stack.storage_fault_counts()
    phase("stopped")
    verdict.elapsed_s = round(time.monotonic() - started, 1)
    return verdict


def breaker_figures(logs: list[Path]) -> tuple[dict[str, int], int]:
    """Circuit breaker openings per remote service, and lines postponed, from the host logs."""
    opened: Counter = Counter()
    postponed = 0
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            if "circuit breaker for " in line and line.rstrip().endswith("-> open"):
                opened[line.split("circuit breaker for ", 1)[1].split(":", 1)[0]] += 1
            elif "[scheduler.dispatch]" in line and " postponed for " in line:
                postponed += 1
    return dict(opened), postponed


def recognised_writes(logs: list[Path]) -> dict[str, int]:
    """Ambiguous writes the hosts found applied (adapters/store.py logs each), by kind."""
    found: Counter = Counter()
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            if "recognised by its write id" in line:
                found[line.split(": the ", 1)[1].split(" ", 1)[0]] += 1
    return dict(found)


def _resubmit(stack: LocalStack, order_id: str) -> str | None:
    """``ordersctl resubmit ORDER``, as an operator runs it; the error, if it failed."""
    done = subprocess.run(
        [sys.executable, "-m", "ordersctl", "resubmit", order_id],
        cwd=ROOT, env={**os.environ, **stack.env}, capture_output=True, text=True, timeout=60,
    )
    return None if done.returncode == 0 else f"resubmit {order_id} failed: {_failure(done.stderr)}"


def _failure(stderr: str) -> str:
    """Where a command failed: the project's own frames of its traceback (the last four,
    relative paths) and its last line, or the last line alone."""
    lines = [line.strip() for line in stderr.strip().splitlines()]
    if not lines:
        return "(nothing on stderr)"
    root = f"{ROOT}/"
    ours = [line.replace(root, "") for line in lines
            if line.startswith('File "') and root in line and "site-packages" not in line]
    return " <- ".join([lines[-1], *reversed(ours[-4:])])


def operator_phase(stack: LocalStack, store: StateStore, verdict: Verdict, errors: list[str]) -> None:
    """Act as the operator: with the remote's faults cleared, resubmit every order in
    Error. Each continues where it stopped: the undos that failed run again and the
    order ends Compensated, or the stopped step runs again (same idempotency key) and
    the order ends Processed. The effects must stay consistent with every final state."""
    stack.remote.set_faults()  # every service: no script, no rates
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="resubmit") as pool:
        verdict.problems += [problem for problem in pool.map(lambda o: _resubmit(stack, o), errors) if problem]
    verdict.resubmitted = len(errors)
    deadline = time.monotonic() + 60
    final: dict[str, OrderState] = {}
    while time.monotonic() < deadline:
        final = {o: store.get(o) for o in errors}
        if all(state.process_state in (ProcessState.PROCESSED, ProcessState.COMPENSATED) for state in final.values()):
            break
        time.sleep(0.5)
    while stack.remote.effects()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.2)
    verdict.after_resubmit = dict(Counter(state.process_state.value for state in final.values()))
    ends = (ProcessState.PROCESSED, ProcessState.COMPENSATED)
    stuck = sorted(o for o, s in final.items() if s.process_state not in ends)
    if stuck:
        verdict.problems.append(f"resubmitted orders not Processed or Compensated: {stuck[:5]}")
    audit = audit_effects(store.list_states(id_prefix="soak-"), stack.remote.effects())
    verdict.audit_after_resubmit = audit
    # The final states against the effects, again; twice and late count only anew (the
    # first audit reported the earlier ones).
    wrong = audit.failures(("processed", "compensated", "error"))
    for service, after in audit.totals.items():
        before = verdict.audit.totals.get(service, {})
        wrong += [f"{service}: {after[what] - before.get(what, 0)} more {label}"
                  for what, label in (("twice", "applied twice"), ("late", "late calls"))
                  if after[what] > before.get(what, 0)]
    if wrong:
        verdict.problems.append("after the operator's resubmits, effects do not match: " + "; ".join(wrong))
    # Alerts are peeked (left for an operator): any beyond the first audit's are new.
    verdict.alerts_after_resubmit = len(read_alerts(stack.servicebus_connection_string)) - sum(
        verdict.alerts_by_order.values()
    )
    if verdict.alerts_after_resubmit:
        verdict.problems.append(f"{verdict.alerts_after_resubmit} new alerts after the operator's resubmits")


def _audit(orders, states: dict[str, OrderState], effects, alerts: list[dict], scripted: dict[str, int], duplicates,
           replayed, killed_at, leftover, dead) -> Verdict:
    by_state = {s: {o for o, state in states.items() if state.process_state is s} for s in _FINAL}
    compensated, errors = by_state[ProcessState.COMPENSATED], by_state[ProcessState.ERROR]
    refused = {o for o in compensated if " refused" in (states[o].cause or "").split(":")[0]}
    undo_failed = {o for o in errors if states[o].kind is Kind.COMPENSATION}
    not_terminal = sorted(o for o, s in states.items() if not s.process_state.terminal)
    not_terminal += [f"{soak_id(i)} (never written)" for i in range(orders) if soak_id(i) not in states]
    alerts_by_order = Counter(alert["order_id"] for alert in alerts)
    steps = [step.name for step in CURRENT.steps]
    misnamed = sorted(
        alert["order_id"] for alert in alerts
        if alert["order_id"] in errors
        and alert.get("failed_compensations", []) != [steps[i] for i in states[alert["order_id"]].failed]
    )
    audit = audit_effects(states.values(), effects)
    v = Verdict(
        orders=orders, processed=len(by_state[ProcessState.PROCESSED]),
        compensated_refused=len(refused), compensated_gave_up=len(compensated - refused),
        error_undo_failed=len(undo_failed), error_stopped=len(errors - undo_failed),
        scripted={o: ERROR_SCRIPTS[kind][0] for o, kind in scripted.items()}, not_terminal=not_terminal,
        audit=audit, alerts_by_order=dict(alerts_by_order), alerts_misnamed=misnamed,
        duplicates_sent=duplicates, responses_replayed=replayed, host_killed_at=killed_at,
        leftover=leftover, dead_letters=dead,
    )
    if not_terminal:
        v.problems.append(f"{len(not_terminal)} orders not in a final state: {not_terminal[:5]}")
    v.problems += audit.failures()
    not_error = sorted(o for o in scripted if o in states and states[o].process_state is not ProcessState.ERROR)
    if not_error:
        v.problems.append(f"orders scripted to fail not in Error: {not_error[:5]}")
    if set(alerts_by_order) != errors or any(n != 1 for n in alerts_by_order.values()):
        wrong = {o: alerts_by_order.get(o, 0) for o in set(alerts_by_order) | errors if alerts_by_order.get(o, 0) != 1}
        v.problems.append(f"alerts are not exactly one per Error order: {dict(list(wrong.items())[:5])}")
    if misnamed:
        v.problems.append(f"alerts not naming the undos that failed: {misnamed[:5]}")
    stuck = {name: n for name, n in leftover.items() if n and name != names.ALERTS_QUEUE}
    if stuck:
        v.problems.append(f"messages left in queues: {stuck}")
    if dead:
        v.problems.append(f"dead-lettered messages: { {q: dict(Counter(r)) for q, r in dead.items()} }")
    return v


def _effects_line(audit: EffectsAudit) -> str:
    return "; ".join(
        f"{service} applied {t['applied']}, undone {t['undone']}, left {t['left']}"
        for service, t in audit.totals.items()
    )


def print_verdict(v: Verdict) -> None:
    console.print(f"orders {v.orders}: processed {v.processed}, compensated {v.compensated} "
                  f"(a step refused {v.compensated_refused}, a step gave up {v.compensated_gave_up}), "
                  f"error {v.errors} (an undo failed {v.error_undo_failed}, ship gave up {v.error_stopped}; "
                  f"{len(v.scripted)} scripted), not in a final state {len(v.not_terminal)}")
    console.print(f"remote effects: {_effects_line(v.audit)}; applied twice "
                  f"{sum(t for t in _counts(v.audit, 'twice'))}, late calls {sum(_counts(v.audit, 'late'))}")
    console.print("effects vs final states: "
                  + ("consistent at every service" if v.audit.ok else "; ".join(v.audit.failures())))
    console.print(f"alerts {sum(v.alerts_by_order.values())} for {len(v.alerts_by_order)} orders")
    console.print(f"operator resubmitted {v.resubmitted} Error orders (faults cleared): then "
                  f"{v.after_resubmit or '-'}; effects "
                  + ("consistent" if v.audit_after_resubmit and v.audit_after_resubmit.ok else "NOT consistent"
                     if v.audit_after_resubmit else "not checked")
                  + (f" ({_effects_line(v.audit_after_resubmit)})" if v.audit_after_resubmit else ""))
    console.print(f"chaos: {v.duplicates_sent} duplicate order messages, {v.responses_replayed} replayed agent responses, "
                  f"host killed at {v.host_killed_at if v.host_killed_at is None else round(v.host_killed_at, 1)} s; "
                  f"circuit breakers opened {v.breaker_opened or 0}, {v.postponed} lines postponed")
    console.print(f"queues left: {v.leftover}; dead-letters: { {q: dict(Counter(r)) for q, r in v.dead_letters.items()} }")
    console.print(f"phases (s since the start): {v.phases}")
    if v.servicebus_faults:
        console.print(f"Service Bus faults injected: {v.servicebus_faults}")
    console.print(f"elapsed {v.elapsed_s} s — " + ("[green]all checks passed[/green]" if v.ok else
                                                     "[red]FAILED: " + "; ".join(v.problems) + "[/red]"))


def _counts(audit: EffectsAudit, check: str) -> list[int]:
    """The counts behind the twice/late problems ("3 late calls" -> 3)."""
    return [int(problem.split()[0]) for problems in audit.problems[check].values() for problem in problems]


SOAK_TITLE = "## Chaos soak"
PUSHBACK_TITLE = "## Chaos soak under Azure's push-back"
_THROUGHPUT = re.compile(r"\| throughput \(orders sent to all final\) \| ([\d.]+) orders/s \|")


def _soak_sections(report: Path) -> dict[str, str]:
    """The soak block's sections by title (the plain soak's, the push-back soak's)."""
    text = report.read_text(encoding="utf-8") if report.exists() else ""
    begin, end = text.find(SOAK_BEGIN), text.find(SOAK_END)
    if begin < 0 or end < 0:
        return {}
    block = "\n" + text[begin + len(SOAK_BEGIN):end]
    return {"## " + chunk.split("\n", 1)[0].strip(): ("## " + chunk).rstrip() + "\n" for chunk in block.split("\n## ")[1:]}


def baseline_throughput(report: Path) -> float | None:
    """The plain soak's orders/s, as its section in ``report`` gives it."""
    match = _THROUGHPUT.search(_soak_sections(report).get(SOAK_TITLE, ""))
    return float(match[1]) if match else None


def write_soak_report(report: Path, markdown: str) -> None:
    """Replace this soak's section (plain or push-back) in the report's soak block, keeping the other."""
    sections = _soak_sections(report)
    sections[markdown.split("\n", 1)[0].strip()] = markdown
    ordered = [sections[t] for t in (SOAK_TITLE, PUSHBACK_TITLE) if t in sections]
    write_soak_section(report, "\n".join(part.rstrip() + "\n" for part in ordered))


def verdict_json(v: Verdict) -> dict:
    """The soak's figures for ``--json``: the keys issue 20 names, then the detail."""
    never_written = [o for o in v.not_terminal if o.endswith("(never written)")]
    effect_failures = {o for check in ("processed", "compensated", "error")
                       for found in v.audit.problems.get(check, {}).values() for o in found}
    return {
        "orders": v.orders,
        "not_terminal": len(v.not_terminal),
        # Orders never written, or whose remote effects do not match their final state.
        "lost": len(never_written) + len(effect_failures),
        "applied_twice": sum(_counts(v.audit, "twice")),
        "late_calls": sum(_counts(v.audit, "late")),
        "alerts": sum(v.alerts_by_order.values()),
        "error_orders": v.errors,
        # Injected faults by kind: the storage proxy's, then the Service Bus emulator's.
        "faults": {**v.fault_counts.get("faults", {}), **{f"servicebus-{k}": n for k, n in v.servicebus_faults.items()}},
        "ok": v.ok,
        "problems": v.problems,
        "orders_per_second": v.orders_per_second,
        "elapsed_s": v.elapsed_s,
        "phases": v.phases,
        "load_average": v.load_average,
        "missed_deadlines": v.misses,
        "storage_faults": v.storage_faults,
        "storage_requests": v.fault_counts.get("requests", {}),
        "recognised": v.recognised,
        "faults_by_service": v.fault_counts.get("faults_by_service", {}),
        # Forwarding failures of the proxy itself (not injected faults): should stay 0.
        "storage_upstream_errors": v.fault_counts.get("upstream_errors", 0),
        "processed": v.processed,
        "compensated": v.compensated,
        "alerts_misnamed": len(v.alerts_misnamed),
        "after_resubmit": v.after_resubmit,
        "duplicates_sent": v.duplicates_sent,
        "responses_replayed": v.responses_replayed,
        "host_killed_at": v.host_killed_at,
    }


def verdict_markdown(v: Verdict, *, seed: int, machine: dict[str, str], baseline: float | None = None) -> str:
    """The soak's section of ``BENCHMARKS.md`` (under Azure's push-back: its own section,
    with the throughput against ``baseline``, the plain soak's orders/s)."""
    killed = "not killed" if v.host_killed_at is None else f"killed (SIGKILL) at {v.host_killed_at:.1f} s and restarted"
    dead = "; ".join(
        f"{queue}: " + ", ".join(f"{reason} {n}" for reason, n in Counter(reasons).items())
        for queue, reasons in v.dead_letters.items() if reasons
    )

    def result(audit: EffectsAudit | None, check: str) -> str:
        if audit is None:
            return "not checked"
        failed = [s for s in audit.services if not audit.passed(check, s)]
        if failed:
            return f"FAILED at {', '.join(failed)}"
        return f"passed ({audit.checked[check]} {'calls' if check in ('twice', 'late') else 'orders'})"

    after = v.after_resubmit
    rows = [
        ("orders", v.orders, "every one in a final state"),
        ("Processed", v.processed, ""),
        ("Compensated: a step refused", v.compensated_refused, "no alert"),
        ("Compensated: a step gave up (outcome unknown)", v.compensated_gave_up, "no alert"),
        ("Error: an undo failed", v.error_undo_failed, "one alert each, naming it"),
        ("Error: ship gave up (it cannot be undone)", v.error_stopped, "one alert each"),
        ("of the Error orders: scripted to fail", len(v.scripted), "must all be Error"),
        ("not in a final state", len(v.not_terminal), "must be 0"),
        ("alerts (orders alerted)", f"{sum(v.alerts_by_order.values())} ({len(v.alerts_by_order)})", "= Error orders"),
        *((f"{service}: applied / undone / left applied", f"{t['applied']} / {t['undone']} / {t['left']}",
           "left = Processed + what the Error orders left")
          for service, t in v.audit.totals.items()),
        *((EFFECT_CHECKS[check], result(v.audit, check), "at every service") for check in EFFECT_CHECKS),
        ("operator resubmits (every Error order, faults cleared)", v.resubmitted, ""),
        ("after the resubmits: Processed / Compensated / Error",
         f"{after.get('Processed', 0)} / {after.get('Compensated', 0)} / {after.get('Error', 0)}", "Error must be 0"),
        ("after the resubmits: effects vs every final state", "passed" if v.audit_after_resubmit and v.audit_after_resubmit.ok
         else "FAILED" if v.audit_after_resubmit else "not checked", "no new alert"),
        ("duplicate order messages sent", v.duplicates_sent, ""),
        ("agent responses replayed", v.responses_replayed, ""),
        ("circuit breaker openings (per service, per host) / lines postponed meanwhile",
         f"{sum(v.breaker_opened.values())} / {v.postponed}",
         ", ".join(f"{service} {n}" for service, n in sorted(v.breaker_opened.items())) or ""),
        ("missed deadlines counted: resets / give-ups (of them answered in time, recorded late)",
         " / ".join(f"{sum(v.misses.get(k, {}).values())}" for k in ("retry", "give_up"))
         + " (" + " / ".join(str(v.misses.get(k, {}).get(ANSWERED_IN_TIME_RECORDED_LATE, 0))
                             for k in ("retry", "give_up")) + ")",
         "the app's own plumbing, not the remote (benchmarks/misses.py)"),
        ("messages left in queues (alerts aside; the scheduler's poison queue included)",
         sum(n for q, n in v.leftover.items() if q != names.ALERTS_QUEUE), "must be 0"),
        ("dead-lettered", dead or 0, "must be 0"),
        ("elapsed", f"{v.elapsed_s} s", ""),
        ("throughput (orders sent to all final)", f"{v.orders_per_second} orders/s", ""),
    ]
    if v.servicebus_faults:
        rows += [(f"Service Bus faults injected: {kind}", n, "") for kind, n in sorted(v.servicebus_faults.items())]
    if v.pushback:
        injected = v.fault_counts.get("faults", {})
        rows += [
            ("storage requests through the fault proxy (tables / queues)",
             " / ".join(str(v.fault_counts.get("requests", {}).get(s, 0)) for s in ("table", "queue")), ""),
            *((f"storage faults injected: {kind}", injected.get(kind, 0), "") for kind in STORAGE_FAULT_KINDS),
            ("writes answered failed but found applied (by their write id): transitions / creates",
             f"{v.recognised.get('write', 0)} / {v.recognised.get('create', 0)}", "each went on as written"),
        ]
        if baseline:
            rows.append(("throughput with push-back / without (the plain soak above)",
                         f"{v.orders_per_second / baseline:.2f}", f"{v.orders_per_second} / {baseline} orders/s"))
    faults = "; ".join(
        f"{service}: " + ", ".join(f"{kind} {rate:.0%}" for kind, rate in rates.items())
        for service, rates in SOAK_FAULTS.items()
    )
    kinds = "; ".join(f"({n}) {what}" for n, (what, _) in enumerate(ERROR_SCRIPTS[: len(v.scripted)], 1))
    soak_settings = {**SOAK_SETTINGS, **(SERVICEBUS_PUSHBACK_SETTINGS if v.servicebus_faults else {})}
    settings = ", ".join(f"`{k}={v_}`" for k, v_ in soak_settings.items())
    pushback = (
        f" Azure Storage's push-back between the app and Azurite (tools/storage_faults), per request: "
        f"`{v.storage_faults}`; the soak's own audit reads Azurite directly." if v.storage_faults else ""
    ) + (" Service Bus push-back from the emulator (throttling, lost locks, dropped links and connections)."
         if v.servicebus_faults else "")
    lines = [
        PUSHBACK_TITLE if v.pushback else SOAK_TITLE,
        "",
        f"`make soak` (`python -m benchmarks.soak --orders {v.orders} --seed {seed}"
        f"{' --azure-faults' if v.pushback else ''}`), {machine['date']}, "
        f"{machine['cores']} cores ({machine['cpu']}), Python {machine['python']}"
        + (f", load average {v.load_average.get('stack up')} when the orders were sent and "
           f"{v.load_average.get('all final')} when all were final (the machine is shared)" if v.load_average else "")
        + ": the three-step workflow "
        f"(reserve@inventory, charge@payments, ship@shipping) on two local hosts (two supervisors), "
        f"host 1 {killed}; remote faults per call: {faults} (transient, throttle and drop are retried; slow answers "
        f"after the step's deadline, a lost response; permanent refusals hit actions and compensations alike); "
        f"{len(v.scripted)} orders scripted to end in Error, in turn: {kinds}; settings: {settings}, "
        f"Service Bus lock duration {SOAK_LOCK_SECONDS:g} s.{pushback}",
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
    storage_faults: Annotated[str | None, typer.Option(help=STORAGE_FAULTS_HELP)] = None,
    servicebus_faults: Annotated[str | None, typer.Option(help=SERVICEBUS_FAULTS_HELP)] = None,
    azure_faults: Annotated[bool, typer.Option(
        help="Azure's push-back at its default rates: storage faults (503=0.02,500-applied=0.01,"
             "reset-applied=0.01,latency=0.05:0.5) and Service Bus faults (ServiceBusFaults.default()).")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON to this file.")] = None,
) -> None:
    """Run the chaos soak and audit the outcome (exit 1 if any check fails).

    With Azure's push-back (``--azure-faults`` or ``--storage-faults``) the figures go to
    the report's push-back section, beside the plain soak's."""
    machine = describe()
    faults = storage_faults_option(storage_faults)
    bus_faults = servicebus_faults_option(servicebus_faults)
    if azure_faults:
        faults = faults or StorageFaults.default()
        bus_faults = bus_faults or ServiceBusFaults.default()
    verdict = run_soak(orders, seed=seed, time_limit=time_limit, storage_faults=faults, servicebus_faults=bus_faults)
    print_verdict(verdict)
    if verdict.fault_counts:
        console.print(f"Azure's push-back: {verdict.storage_faults}; injected {verdict.fault_counts.get('faults')}, "
                      f"of {verdict.fault_counts.get('requests')} requests; writes found applied by their write id "
                      f"{verdict.recognised or 0}; {verdict.orders_per_second} orders/s")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(verdict_json(verdict), indent=2) + "\n")
        console.print(f"figures written to {json_out}")
    baseline = baseline_throughput(report) if verdict.pushback else None
    write_soak_report(report, verdict_markdown(verdict, seed=seed, machine=machine, baseline=baseline))
    console.print(f"figures written to the {'push-back ' if verdict.pushback else ''}chaos soak section "
                  f"of {report.name}")
    raise typer.Exit(0 if verdict.ok else 1)


if __name__ == "__main__":
    typer.run(main)
