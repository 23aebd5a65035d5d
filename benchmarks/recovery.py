"""Recovery: a host is killed (SIGKILL) while the fake remote service holds the agent's
call for an order (``slow``: the effect is applied, the response never comes); another
host recovers the order once the supervisor sees the step expire.

Timeline of one trial, from the state row (polled every 50 ms) and the clock here::

    claim ──(step timeout)──► CompleteBy ──(next supervisor tick)──► reset to Pending
          ──(retry backoff, then the queue poll)──► claim, attempt 2 ──► Processed

The target (step timeout + supervisor period + 2 s) is a bound for a kill right after
the claim, the worst moment. The trial kills a little later: the second host is started
and warmed up (a few orders through it, so its links are open, as a long-running
instance's are) while the first one holds the call. So both *kill -> Processed* and
*claim -> Processed* (what a kill at the claim would take) are reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from adapters.store import StateStore
from benchmarks import pipeline
from benchmarks.stack import BenchStack, OrderSender
from core.models import OrderState, ProcessState

#: The recovery trial's settings (app settings of the hosts).
STEP_TIMEOUT = 8.0
SUPERVISOR_PERIOD = 2.0
SETTINGS = {"STEP_TIMEOUT_SECONDS": f"{STEP_TIMEOUT:g}", "SUPERVISOR_SCHEDULE": f"*/{SUPERVISOR_PERIOD:g} * * * * *"}
TARGET = STEP_TIMEOUT + SUPERVISOR_PERIOD + 2.0


@dataclass
class Trial:
    order_id: str
    claimed: float
    killed: float
    complete_by: float
    reset: float | None
    reclaimed: float | None
    processed: float | None
    effects: int
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


def trial(stack: BenchStack, sender: OrderSender, order_id: str, *, timeout: float = 60.0) -> Trial:
    """One trial; needs exactly one running host (the victim). Leaves one running host."""
    store = StateStore(stack.table())
    victims = stack.alive_hosts()
    if len(victims) != 1:
        raise RuntimeError(f"a recovery trial needs exactly one running host, found {len(victims)}")
    stack.remote.set_faults(script={order_id: ["slow"]}, slow_seconds=120)
    sender.send([order_id])
    deadline = time.monotonic() + timeout
    while True:
        effects = stack.remote.effects()
        if effects["by_order"].get(order_id, 0) >= 1 and effects["in_flight"] >= 1:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"order {order_id} never reached the remote service")
        time.sleep(0.02)
    state = store.get(order_id)
    claimed = state.updated_at.timestamp()
    complete_by = state.complete_by.timestamp()
    stack.start_hosts(1)  # the survivor: running and warm before the crash, as in a real deployment
    pipeline.warm_up(stack, sender, f"{order_id}-warm-", count=10)
    if time.time() > complete_by - 1:
        raise RuntimeError("the survivor took too long to start: the step would expire before the kill")
    killed = time.time()
    stack.kill_host(victims[0])
    timeline: dict[str, float | None] = {"reset": None, "reclaimed": None}

    def done(state: OrderState) -> bool:
        if timeline["reset"] is None and state.process_state is ProcessState.PENDING:
            timeline["reset"] = state.updated_at.timestamp()
        if timeline["reclaimed"] is None and state.process_state is ProcessState.PROCESSING and state.attempt >= 2:
            timeline["reclaimed"] = state.updated_at.timestamp()
        return state.process_state in (ProcessState.PROCESSED, ProcessState.ERROR)

    final = _poll(store, order_id, done, timeout)
    stack.remote.set_faults()  # no script left for the next trial
    processed = None
    if final is not None and final.process_state is ProcessState.PROCESSED:
        processed = pipeline.processed_at(final)
    return Trial(
        order_id=order_id,
        claimed=claimed,
        killed=killed,
        complete_by=complete_by,
        reset=timeline["reset"],
        reclaimed=timeline["reclaimed"],
        processed=processed,
        effects=stack.remote.effects()["by_order"].get(order_id, 0),
        attempts=final.attempt if final is not None else 0,
    )
