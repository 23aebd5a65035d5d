"""Small statistics shared by the demo and the benchmarks, and the audit both the demo
and the chaos soak make of a run: do the remote services' effects match the orders'
final states?

:func:`audit_effects` takes the orders' states (as the store reads them) and the fake
remote's ``effects()`` and checks, per remote service:

- a **Processed** order has each of its actions applied exactly once and nothing undone;
- a **Compensated** order has every applied action undone once: nothing is left applied;
- an **Error** order has nothing left applied but what its state says may be: the steps
  whose undo failed (``failed``), or, when it stopped in its actions (a step that
  cannot be undone gave up), the steps done before the stopped one and that step itself
  (its outcome is unknown). :attr:`EffectsAudit.left_applied` lists what each Error
  order leaves applied, for the operator;
- nothing was applied twice, and no call reached a service after its ``Complete-By``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.models import OrderState, ProcessState
from core.workflow import Kind, UnknownWorkflow, workflow


def percentile(values: list[float], q: int) -> float | None:
    """The ``q``-th percentile (1-99) of ``values``, inclusive method; None when there are none."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


# --- effects against final states ----------------------------------------------------

#: The per-service checks of :func:`audit_effects`: key -> what it checks.
EFFECT_CHECKS: dict[str, str] = {
    "processed": "Processed: every action applied once, nothing undone",
    "compensated": "Compensated: every applied action undone once (net 0)",
    "error": "Error: nothing left applied but the failed undos (or the stopped step)",
    "twice": "nothing applied twice",
    "late": "no call after Complete-By",
}


@dataclass
class EffectsAudit:
    """The outcome of :func:`audit_effects`."""

    services: tuple[str, ...]
    #: check key -> service -> the orders (or counts, for twice/late) that fail it.
    problems: dict[str, dict[str, list[str]]]
    #: How many final orders each check looked at, per check key (twice/late: calls).
    checked: dict[str, int]
    #: Error order -> what it leaves applied, as ``"service action"`` (empty: nothing).
    left_applied: dict[str, list[str]] = field(default_factory=dict)
    #: Orders with effects at a remote service that the run does not know.
    unknown_orders: list[str] = field(default_factory=list)
    #: Per service: forward actions applied, compensations that undid one, left applied,
    #: applications twice and late calls.
    totals: dict[str, dict[str, int]] = field(default_factory=dict)

    def passed(self, check: str, service: str | None = None) -> bool:
        per_service = self.problems.get(check, {})
        if service is not None:
            return not per_service.get(service)
        return not any(per_service.values())

    @property
    def ok(self) -> bool:
        return all(self.passed(check) for check in EFFECT_CHECKS) and not self.unknown_orders

    def failures(self, checks: tuple[str, ...] = tuple(EFFECT_CHECKS)) -> list[str]:
        """One line per failed check (of ``checks``) and service, naming a few of the orders."""
        lines = [
            f"{service}: {EFFECT_CHECKS[check]}: FAILED for {', '.join(orders[:5])}"
            + (f" and {len(orders) - 5} more" if len(orders) > 5 else "")
            for check in checks
            for service, orders in self.problems.get(check, {}).items()
            if orders
        ]
        if self.unknown_orders:
            lines.append(f"effects for orders the run does not know: {self.unknown_orders[:5]}")
        return lines


def _allowed(state: OrderState, steps: int) -> dict[int, set[int]]:
    """Step index -> the net applications it may show, for an order in a final state."""
    if state.process_state is ProcessState.PROCESSED:
        return {i: {1} for i in range(steps)}
    if state.process_state is ProcessState.COMPENSATED:
        return {i: {0} for i in range(steps)}
    # Error.
    if state.kind is Kind.ACTION and not state.failed:
        # Stopped in its actions (a step with no undo gave up): the steps before it are
        # done, its own outcome is unknown, the later ones never ran.
        return {i: {1} if i < state.step_index else {0, 1} if i == state.step_index else {0} for i in range(steps)}
    # Stopped while undoing: only the steps whose undo failed may be left applied.
    return {i: {0, 1} if i in state.failed else {0} for i in range(steps)}


def audit_effects(states: Iterable[OrderState], effects: Mapping[str, Any]) -> EffectsAudit:
    """Check the fake remote's ``effects()`` against the orders' final states (orders
    not in a final state are left out: check those separately)."""
    services = tuple(effects["services"])
    problems: dict[str, dict[str, list[str]]] = {check: {s: [] for s in services} for check in EFFECT_CHECKS}
    checked = {check: 0 for check in EFFECT_CHECKS}
    audit = EffectsAudit(services, problems, checked)
    net: Mapping[str, Mapping[str, Mapping[str, int]]] = effects.get("net", {})
    known: set[str] = set()
    for state in states:
        known.add(state.order_id)
        if not state.process_state.terminal:
            continue
        check = state.process_state.value.lower()
        checked[check] += 1
        try:
            steps = workflow(state.workflow, state.workflow_version).steps
        except UnknownWorkflow:
            problems[check].setdefault("?", []).append(state.order_id)
            continue
        allowed = _allowed(state, len(steps))
        left: list[str] = []
        for index, step in enumerate(steps):
            if step.waiting:  # calls no remote
                continue
            service = effects["services"].get(step.remote)
            if service is None:
                problems[check].setdefault(step.remote, []).append(state.order_id)
                continue
            applied = service["applied"].get(state.order_id, []).count(step.action)
            remaining = net.get(state.order_id, {}).get(step.remote, {}).get(step.action, 0)
            wrong = remaining not in allowed[index]
            if state.process_state is ProcessState.PROCESSED:
                # Exactly one application, and no compensation at that service at all.
                wrong = wrong or applied != 1 or bool(service["undone"].get(state.order_id))
            if wrong and state.order_id not in problems[check][step.remote]:
                problems[check][step.remote].append(state.order_id)
            if remaining > 0:
                left.append(f"{step.remote} {step.action}" + (f" ×{remaining}" if remaining > 1 else ""))
        if state.process_state is ProcessState.ERROR:
            audit.left_applied[state.order_id] = left
    for name, service in effects["services"].items():
        checked["twice"] += service.get("calls", 0)
        checked["late"] += service.get("calls", 0)
        if service.get("twice"):
            problems["twice"][name].append(f"{service['twice']} applied twice")
        if service.get("late"):
            problems["late"][name].append(f"{service['late']} late calls")
        applied = sum(len(actions) for actions in service["applied"].values())
        undone = sum(len(actions) for actions in service["undone"].values())
        audit.totals[name] = {"applied": applied, "undone": undone, "left": applied - undone,
                              "twice": service.get("twice", 0), "late": service.get("late", 0)}
    audit.unknown_orders = sorted(set(net) - known)
    return audit
