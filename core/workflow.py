"""Workflows declared as data: an ordered list of steps, each at a remote service, with
its action, its compensating action (or none) and its policy.

This is the one place a workflow is written down. Queues, app settings, agent
functions, the Bicep and the tests all follow from it (``core.names`` derives the
names; tests/infra ties them to the Bicep). Adding a step is one :class:`Step` here
plus the remote's URL setting (``REMOTE_<NAME>_URL``) if its service is new.

Definitions are versioned: an order records the workflow name and version it started
on and finishes on that definition, so a new version must be added beside the old
one (in :data:`WORKFLOWS`), never edited in place while orders may be in flight.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from enum import Enum

#: Remote service and step names become queue names, app-setting names and function
#: names: lower-case letters and digits only, starting with a letter.
_NAME = re.compile(r"^[a-z][a-z0-9]{0,30}$")


class Kind(str, Enum):
    """What a line of the workflow does at its remote service."""

    ACTION = "action"
    COMPENSATION = "compensation"


#: The longest deadline a step may be given: a year (the approval timeout's own limit).
MAX_TIMEOUT_SECONDS = 366 * 24 * 3600.0


@dataclass(frozen=True)
class StepPolicy:
    """How one step is run and supervised; ``None`` takes the app setting's default.

    ============================  =====================================
    field                         default app setting
    ============================  =====================================
    ``timeout_seconds``           ``STEP_TIMEOUT_SECONDS``
    ``max_failures``              ``MAX_FAILURES``
    ``agent_max_calls``           ``AGENT_MAX_CALLS``
    ``agent_backoff_initial``     ``AGENT_BACKOFF_INITIAL_SECONDS``
    ``agent_backoff_max``         ``AGENT_BACKOFF_MAX_SECONDS``
    ``wait_timeout_seconds``      ``APPROVAL_TIMEOUT_SECONDS``
    ============================  =====================================

    A compensation runs with the policy of the step it undoes. ``wait_timeout_seconds`` is
    read from the defaults only: a waiting step's deadline when its own ``timeout_seconds``
    is unset (:meth:`Step.policy_over`).
    """

    timeout_seconds: float | None = None
    max_failures: int | None = None
    agent_max_calls: int | None = None
    agent_backoff_initial: float | None = None
    agent_backoff_max: float | None = None
    wait_timeout_seconds: float | None = None

    def __post_init__(self) -> None:
        """Refuse, when the workflow is defined, a value that would break an order at run
        time (after its claim was written): a deadline that is not a positive, finite number
        of seconds (at most :data:`MAX_TIMEOUT_SECONDS`), counts below 1, backoffs not
        positive or not finite."""
        for name in ("timeout_seconds", "wait_timeout_seconds"):
            value = getattr(self, name)
            if value is not None and not (0 < value <= MAX_TIMEOUT_SECONDS):
                raise ValueError(f"{name} must be more than 0 and at most {MAX_TIMEOUT_SECONDS:.0f} s, not {value!r}")
        for name in ("max_failures", "agent_max_calls"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")
        for name in ("agent_backoff_initial", "agent_backoff_max"):
            value = getattr(self, name)
            if value is not None and not (0 < value <= MAX_TIMEOUT_SECONDS):
                raise ValueError(f"{name} must be more than 0 and at most {MAX_TIMEOUT_SECONDS:.0f} s, not {value!r}")

    def over(self, defaults: StepPolicy) -> StepPolicy:
        """This policy with every unset field taken from ``defaults``."""
        return replace(
            defaults, **{f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        )


@dataclass(frozen=True)
class Step:
    """A step at a remote service (``remote``, ``action``), or a waiting step
    (``wait_for``): one that calls no remote but waits for an external event (an
    approval) until its deadline: ``policy.timeout_seconds`` when the workflow fixes one,
    else the app setting ``APPROVAL_TIMEOUT_SECONDS`` (:meth:`policy_over`). A waiting step has no agent
    and no queue, nothing to undo (``compensate`` stays None; an undo skips it), and one
    attempt: its deadline passing is a give-up, and the scheduler then undoes the steps
    before it (docs/workflows.md, "Waiting steps")."""

    name: str
    #: The remote service: its agent function, request queue and URL setting follow from it.
    remote: str = ""
    #: ``POST {remote base URL}/{action}``.
    action: str = ""
    #: The action that undoes ``action`` (``POST {base}/{compensate}``), or None when
    #: the step cannot be undone (such steps come after every step that can: :class:`Workflow` checks it).
    compensate: str | None = None
    policy: StepPolicy = field(default_factory=StepPolicy)
    #: The remote offers ``GET {base}/{action}/{idempotency key}`` (200 with the result
    #: if that action was applied, 404 if not): after an attempt whose outcome is
    #: unknown, the agent asks before sending the action again.
    lookup: bool = False
    #: The event this step waits for instead of calling a remote (e.g. ``approval``):
    #: ``POST /api/orders/{id}/events/{wait_for}``, or a message on ``order-events``.
    wait_for: str | None = None

    def __post_init__(self) -> None:
        if self.wait_for is not None:
            self._check_waiting()
            return
        for what, value in (("step", self.name), ("remote", self.remote), ("action", self.action)):
            if not _NAME.match(value):
                raise ValueError(f"{what} name {value!r} must be lower-case letters and digits, starting with a letter")
        if self.compensate is not None and not _NAME.match(self.compensate):
            raise ValueError(f"compensation name {self.compensate!r} must be lower-case letters and digits")
        if self.compensate == self.action:
            # Both would go out under one idempotency key: the remote would take the undo
            # for a replay of the action and undo nothing.
            raise ValueError(f"step {self.name!r}: its compensation must be another action than {self.action!r}")

    def _check_waiting(self) -> None:
        for what, value in (("step", self.name), ("event", self.wait_for)):
            if not _NAME.match(value):
                raise ValueError(f"{what} name {value!r} must be lower-case letters and digits, starting with a letter")
        if self.remote or self.action or self.compensate is not None or self.lookup:
            raise ValueError(f"waiting step {self.name!r} calls no remote: no remote, action, compensation or lookup")
        if self.policy.max_failures not in (None, 1):
            raise ValueError(f"waiting step {self.name!r} has one attempt: its deadline passing is a give-up")
        # One attempt: the supervisor's generic expiry of the line is the give-up.
        object.__setattr__(self, "policy", replace(self.policy, max_failures=1))

    @property
    def waiting(self) -> bool:
        return self.wait_for is not None

    def policy_over(self, defaults: StepPolicy) -> StepPolicy:
        """This step's policy with every unset field taken from ``defaults`` (the app
        settings': ``Settings.step_defaults``): what its lines run with. A waiting step's
        deadline, unless the workflow fixes one, is ``defaults.wait_timeout_seconds``
        (APPROVAL_TIMEOUT_SECONDS), not the steps' timeout (STEP_TIMEOUT_SECONDS)."""
        policy = self.policy.over(defaults)
        if self.waiting and self.policy.timeout_seconds is None:
            if defaults.wait_timeout_seconds is None:
                raise ValueError(
                    f"waiting step {self.name!r} has no deadline: the defaults set no wait_timeout_seconds"
                )
            policy = replace(policy, timeout_seconds=defaults.wait_timeout_seconds)
        return policy

    def action_of(self, kind: Kind) -> str | None:
        if self.waiting:
            return None
        return self.action if kind is Kind.ACTION else self.compensate


#: The most steps one group runs at once: its lines live on the state row (``Group``, a
#: Table string property of at most 32K characters: learn.microsoft.com/rest/api/storageservices/
#: understanding-the-table-service-data-model), each with its last error (core/lifecycle.py
#: ``MAX_LINE_ERROR_CHARS``): ten stay far below the limit.
MAX_GROUP = 10


@dataclass(frozen=True, init=False)
class Parallel:
    """Steps that run at once: a group of a workflow (docs/workflows.md, "Steps that run
    at once"). Every line of the group is claimed in one write and sent to its agent; each
    keeps its own attempt, deadline, idempotency key, retries and supervision. The order
    moves past the group only when every line of it is done. When one is refused or gives
    up, no line of the group starts again; the lines still in flight settle first (their
    answer, or their deadline), then every line of the group that was applied or whose
    outcome is unknown is undone, with the steps before the group, newest first.

    Its steps call remotes (a waiting step waits alone) and can each be undone: undoing
    the group when one of its lines fails must be possible whatever line fails."""

    steps: tuple[Step, ...]

    def __init__(self, *steps: Step) -> None:
        object.__setattr__(self, "steps", tuple(steps))
        if not 2 <= len(self.steps) <= MAX_GROUP:
            raise ValueError(
                f"a group of steps that run at once needs two steps or more and at most {MAX_GROUP}, "
                f"not {len(self.steps)}"
            )
        for step in self.steps:
            if not isinstance(step, Step):
                raise ValueError(f"a group holds steps only, not {step!r} (groups do not nest)")
            if step.waiting:
                raise ValueError(f"step {step.name!r} waits for an event: a waiting step cannot run in a group")
            if step.compensate is None:
                raise ValueError(
                    f"step {step.name!r} cannot be undone: every step of a group must declare its compensation, "
                    "so that the group can be undone whichever of its lines fails"
                )


#: An order's rows are written in entity-group transactions of at most 100 entities
#: (learn.microsoft.com/azure/storage/tables/scalability-targets). The largest: importing
#: a finished order (order + state + an action and an undo row per step: 2 + 2 * 49 = 100);
#: in flight, ending an undo writes the state row, that line and a row per later step
#: that has no undo (at most 1 + 1 + 48).
MAX_STEPS = 49


@dataclass(frozen=True)
class Workflow:
    """A workflow definition: its stages in order, each a :class:`Step` or a
    :class:`Parallel` group of steps. ``steps`` is every step, in order (a group's in
    the order it lists them): a step's index there is its place in the order's rows, names
    and undo order; ``stages`` says which indexes run at once."""

    name: str
    version: int
    steps: tuple[Step, ...]
    #: The stages, as step indexes: ``(0,)`` a step alone, ``(0, 1)`` a group.
    stages: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        stages, flat = [], []
        for stage in self.steps:
            members = stage.steps if isinstance(stage, Parallel) else (stage,)
            stages.append(tuple(range(len(flat), len(flat) + len(members))))
            flat.extend(members)
        object.__setattr__(self, "steps", tuple(flat))
        object.__setattr__(self, "stages", tuple(stages))
        if not self.steps:
            raise ValueError(f"workflow {self.name} v{self.version} has no steps")
        if len(self.steps) > MAX_STEPS:
            raise ValueError(
                f"workflow {self.name} v{self.version} has {len(self.steps)} steps; at most {MAX_STEPS} fit "
                "the 100 entities of one Table Storage transaction (docs/scale.md)"
            )
        names = [step.name for step in self.steps]
        if len(set(names)) != len(names):
            raise ValueError(f"workflow {self.name} v{self.version} repeats a step name: {names}")
        waits = [step.wait_for for step in self.steps if step.waiting]
        if len(set(waits)) != len(waits):
            # An event names no step: a repeat of the first one's event would end the second.
            raise ValueError(f"workflow {self.name} v{self.version}: two steps wait for the same event: {waits}")
        for i, step in enumerate(self.steps):
            if step.waiting or step.compensate is not None:
                continue
            undoable = [later.name for later in self.steps[i + 1:] if later.compensate is not None]
            if undoable:
                # Undoing those would stop at this step, in Error, and a resubmit would stop
                # there again: a step that cannot be undone comes after every step that can.
                raise ValueError(
                    f"workflow {self.name} v{self.version}: step {step.name!r} cannot be undone, so it must come "
                    f"after every step that can (here {', '.join(undoable)})"
                )

    @property
    def key(self) -> tuple[str, int]:
        return self.name, self.version

    def stage_of(self, index: int) -> tuple[int, ...]:
        """The indexes of the steps that run at once with step ``index``, itself among them."""
        return next(stage for stage in self.stages if index in stage)

    def in_group(self, index: int) -> bool:
        """Whether step ``index`` runs at once with others (a :class:`Parallel` group's)."""
        return len(self.stage_of(index)) > 1

    @property
    def parallel(self) -> bool:
        return any(len(stage) > 1 for stage in self.stages)

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


#: The order workflow: reserve stock, take the payment, ship. Shipping cannot be undone,
#: so it comes last: once it is done the order is Processed.
ORDER_WORKFLOW = Workflow(
    "order",
    1,
    (
        Step("reserve", remote="inventory", action="reserve", compensate="release", lookup=True),
        Step("charge", remote="payments", action="charge", compensate="refund", lookup=True),
        Step("ship", remote="shipping", action="ship", compensate=None),
    ),
)

#: The order workflow with an approval: reserve the stock, then wait for a person's
#: approval (the event ``approval``) until the deadline the app setting
#: APPROVAL_TIMEOUT_SECONDS sets (a day by default), then charge and ship. Rejected, or not
#: approved in time: the reservation is released and the order ends Compensated. An order
#: chooses it with ``"workflow": "order-approval"`` (docs/clients.md, "Sending orders").
APPROVAL_WORKFLOW = Workflow(
    "order-approval",
    1,
    (
        ORDER_WORKFLOW.steps[0],
        Step("approve", wait_for="approval"),
        *ORDER_WORKFLOW.steps[1:],
    ),
)

#: The order workflow with its first two steps at once: the stock is reserved and the
#: payment taken together (neither needs the other's result), then the order ships. If
#: either is refused or gives up, the other settles and whatever of the two was applied is
#: undone. An order chooses it with ``"workflow": "order-parallel"`` (docs/workflows.md).
PARALLEL_WORKFLOW = Workflow(
    "order-parallel",
    1,
    (Parallel(*ORDER_WORKFLOW.steps[:2]), *ORDER_WORKFLOW.steps[2:]),
)


def registry(*definitions: Workflow) -> dict[tuple[str, int], Workflow]:
    """The definitions by (name, version); two under one key are refused (orders in flight
    on the first would go on with the other's steps)."""
    found: dict[tuple[str, int], Workflow] = {}
    for definition in definitions:
        if definition.key in found:
            raise ValueError(f"two definitions of workflow {definition}: add a new version instead")
        found[definition.key] = definition
    return found


#: Every definition an order may be running on, by (name, version). Keep old versions
#: here until no order runs on them.
WORKFLOWS: dict[tuple[str, int], Workflow] = registry(ORDER_WORKFLOW, APPROVAL_WORKFLOW, PARALLEL_WORKFLOW)

#: What a new order starts on.
CURRENT = ORDER_WORKFLOW


class UnknownWorkflow(LookupError):
    """An order names a workflow definition this app does not have."""


def _check_current() -> None:
    if WORKFLOWS.get(CURRENT.key) is not CURRENT or latest(CURRENT.name) is not CURRENT:
        raise ValueError(f"CURRENT ({CURRENT}) must be registered in WORKFLOWS and be the newest {CURRENT.name!r}")


def latest(name: str, workflows: dict[tuple[str, int], Workflow] = WORKFLOWS) -> Workflow:
    """The newest version of the workflow ``name``: what a new order naming it starts on."""
    versions = [w for w in workflows.values() if w.name == name]
    if not versions:
        known = sorted({w.name for w in workflows.values()})
        raise UnknownWorkflow(f"no workflow {name!r} (known: {', '.join(known)})")
    return max(versions, key=lambda w: w.version)


def events(workflows: dict[tuple[str, int], Workflow] = WORKFLOWS) -> tuple[str, ...]:
    """Every event name some registered definition waits for, in first-use order."""
    seen: dict[str, None] = {}
    for definition in workflows.values():
        for step in definition.steps:
            if step.wait_for is not None:
                seen.setdefault(step.wait_for, None)
    return tuple(seen)


def shortest_timeout(defaults: StepPolicy, workflows: dict[tuple[str, int], Workflow] = WORKFLOWS) -> float:
    """The shortest deadline, in seconds, any line of a registered definition is given
    (each step's resolved timeout): no line claimed less than this long ago has expired."""
    return min(step.policy_over(defaults).timeout_seconds for w in workflows.values() for step in w.steps)


def workflow(name: str, version: int) -> Workflow:
    try:
        return WORKFLOWS[(name, version)]
    except KeyError:
        raise UnknownWorkflow(f"no workflow {name} v{version} (known: {sorted(WORKFLOWS)})") from None


def remotes(workflows: dict[tuple[str, int], Workflow] = WORKFLOWS) -> tuple[str, ...]:
    """Every remote service some registered definition calls, in first-use order: each
    has an agent function and a request queue (old versions' too, for orders in flight)."""
    seen: dict[str, None] = {}
    for definition in workflows.values():
        for step in definition.steps:
            if not step.waiting:  # a waiting step calls no remote: no agent, no queue
                seen.setdefault(step.remote, None)
    return tuple(seen)


def actions(remote: str, workflows: dict[tuple[str, int], Workflow] = WORKFLOWS) -> dict[str, str | None]:
    """The actions a remote service is called with, each mapped to its compensation."""
    return {
        step.action: step.compensate
        for definition in workflows.values()
        for step in definition.steps
        if step.remote == remote and not step.waiting
    }


_check_current()  # an order without a workflow field and one naming it start alike
