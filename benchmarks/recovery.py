"""Recovery: a host is killed (SIGKILL) while the fake remote service holds the agent's
call for a step in the middle of an order's workflow (``slow`` at that step's action:
the effect is applied, the response never comes); another host recovers the step once
the supervisor sees it expire, and the order runs its remaining steps to Processed.

Timeline of one trial, from the state row (polled every 50 ms) and the clock here::

    step k claimed ──(step timeout)──► CompleteBy ──(next supervisor tick)──► reset to Pending
          ──(retry backoff, the queue poll, a new attempt of step k)──► step k recorded
          ──(the steps after it)──► Processed

The reset is seen by polling (the row stays Pending for the backoff); when step k was
recorded is its row's ``UpdatedAt``; Processed is the state row's commit time.

The target (step timeout + supervisor period + 2 s) is a bound for a kill right after
the claim, the worst moment. The trial kills a little later: the second host is started
and warmed up (a few orders through it, so its links are open, as a long-running
instance's are) while the first one holds the call. So both *kill -> Processed* and
*claim -> Processed* (what a kill at the claim would take) are reported. Every step's
action must be applied exactly once at the remote services (the step run again
carries the same idempotency key).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from adapters.store import StateStore
from benchmarks import pipeline
from benchmarks.stack import BenchStack, OrderSender
from core.models import OrderState, ProcessState
from core.workflow import CURRENT, Kind

#: The recovery trial's settings (app settings of the hosts). The step timeout leaves the
#: survivor time to start and warm up while the victim holds the call, on a busy machine
#: too (a host took up to 6 s to start with other work on both cores).
STEP_TIMEOUT = 12.0
#: Orders through the survivor before the kill: enough to run every function once.
WARM_UP_ORDERS = 3
SUPERVISOR_PERIOD = 2.0
SETTINGS = {"STEP_TIMEOUT_SECONDS": f"{STEP_TIMEOUT:g}", "SUPERVISOR_SCHEDULE": f"*/{SUPERVISOR_PERIOD:g} * * * * *"}
TARGET = STEP_TIMEOUT + SUPERVISOR_PERIOD + 2.0
#: The step held at the remote when the host dies: the middle one (steps before it done,
#: steps after it still to run).
HELD_INDEX = len(CURRENT.steps) // 2
HELD = CURRENT.steps[HELD_INDEX]


@dataclass
class Trial:
    order_id: str
    #: The held step's claim (the state row's UpdatedAt: the transaction that recorded the step before it).
    claimed: float
    killed: float
    complete_by: float
    reset: float | None
    #: When the held step's row was written by its new attempt.
    redone: float | None
    processed: float | None
    #: Forward actions applied at the remote services for this order (one per step when right).
    effects: int
    #: Forward actions applied more than once for this order (must be 0).
    twice: int
    attempts: int

    @property
    def from_kill(self) -> float | None:
        return None if self.processed is None else self.processed - self.killed

    @property
    def from_claim(self) -> float | None:
        return None if self.processed is None else self.processed - self.claimed


def _poll(store: StateStore, order_id: str, until, timeout: float, interval: float = 0.05) -> OrderState | None:
    """The order's state once ``until(state)`` holds, or None after ``timeout`` seconds (a
    trial that times out is a missed target, not a failed phase)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = store.get(order_id)
        if until(state):
            return state
        time.sleep(interval)
    return None


def _applied(effects: dict, order_id: str) -> list[str]:
    """The forward actions applied for an order, over every service (a replay is not applied again)."""
    return [action for service in effects["services"].values() for action in service["applied"].get(order_id, [])]


def _held(effects: dict, order_id: str) -> bool:
    """True once the held step's action is applied and its call is being held."""
    service = effects["services"][HELD.remote]
    return HELD.action in service["applied"].get(order_id, []) and service["in_flight"] >= 1


def trial(stack: BenchStack, sender: OrderSender, order_id: str, *, timeout: float = 60.0) -> Trial:
    """One trial; needs exactly one running host (the victim). Leaves one running host."""
    store = StateStore(stack.table())
    victims = stack.alive_hosts()
    if len(victims) != 1:
        raise RuntimeError(f"a recovery trial needs exactly one running host, found {len(victims)}")
    stack.remote.set_faults(script={f"{order_id}/{HELD.action}": ["slow"]}, service=HELD.remote, slow_seconds=120)
    sender.send([order_id])
    deadline = time.monotonic() + timeout
    while not _held(stack.remote.effects(), order_id):
        if time.monotonic() > deadline:
            raise RuntimeError(f"order {order_id} never reached step {HELD.name} at {HELD.remote}")
        time.sleep(0.02)
    state = store.get(order_id)
    if state.step != HELD.name or state.kind is not Kind.ACTION:
        raise RuntimeError(f"order {order_id} is at {state.kind.value} {state.step}, expected action {HELD.name}")
    held_attempt = state.attempt
    claimed = state.updated_at.timestamp()
    complete_by = state.complete_by.timestamp()
    stack.start_hosts(1)  # the survivor: running and warm before the crash, as in a real deployment
    pipeline.warm_up(stack, sender, f"{order_id}-warm-", count=WARM_UP_ORDERS)
    if time.time() > complete_by - 1:
        raise RuntimeError(
            f"the survivor took {time.time() - claimed:.1f} s to start and warm up: the step would expire "
            f"before the kill (step timeout {STEP_TIMEOUT:g} s; is the machine busy?)"
        )
    killed = time.time()
    stack.kill_host(victims[0])
    reset: list[float] = []

    def done(state: OrderState) -> bool:
        if not reset and state.process_state is ProcessState.PENDING:
            reset.append(state.updated_at.timestamp())
        return state.process_state.terminal

    final = _poll(store, order_id, done, timeout)
    stack.remote.set_faults(service=HELD.remote)  # no script left for the next trial
    processed = redone = None
    if final is not None and final.process_state is ProcessState.PROCESSED:
        processed = pipeline.processed_at(final)
        line = next((x for x in store.read(order_id).lines if x.step == HELD.name and x.kind is Kind.ACTION), None)
        if line is not None and line.attempt > held_attempt:
            redone = line.updated_at.timestamp()
    applied = _applied(stack.remote.effects(), order_id)
    return Trial(
        order_id=order_id,
        claimed=claimed,
        killed=killed,
        complete_by=complete_by,
        reset=reset[0] if reset else None,
        redone=redone,
        processed=processed,
        effects=len(applied),
        twice=len(applied) - len(set(applied)),
        attempts=final.attempt if final is not None else 0,
    )
