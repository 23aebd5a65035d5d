"""The whole app on the local stack: Azurite, the Service Bus emulator, the fake remote
services, and local host processes running the real function_app.py.

``stack`` gives a test its own tables and queues, the fake remote (no faults) and a way
to start hosts with the FAST timings. Besides sending orders and waiting for them, it
reads what an operator would (:meth:`Stack.record`: the order, its state and its step
rows, as ``ordersctl status`` reads them), what the hosts logged (the scheduler's
claims, ignored responses), and it can hand the app agent responses built from a real
one: :meth:`Stack.capture` waits until a line is in flight and keeps the state row as
claimed, which is the fence the real request carries; :meth:`Stack.response` builds a
response with that context.
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from adapters import telemetry
from adapters.messaging import agent_request_id
from adapters.settings import Settings
from adapters.store import OrderNotFound, OrderRecord
from adapters.wiring import services
from core import liveness, names
from core.models import AgentResponse, Context, LineRecord, LineRun, OrderState, Outcome, ProcessState
from core.workflow import Kind, workflow
from supervisor.supervision import liveness_timing
from tests.polling import wait_until
from tests.servicebus_helpers import bodies, close_later, receive

#: Short timings for tests, set through app settings (never by patching code).
FAST = {
    "STEP_TIMEOUT_SECONDS": "2",
    "PENDING_TIMEOUT_SECONDS": "2",
    "SUPERVISOR_SCHEDULE": "*/1 * * * * *",
    "RETRY_BACKOFF_BASE_SECONDS": "0.5",
    "RETRY_BACKOFF_MAX_SECONDS": "2",
    # A sweep every second on each host reads every index shard, and Azurite answers each
    # query by scanning the table: 4 shards (and the two ranges) keep the sharded read
    # exercised at a quarter of the default's queries (16 shards measured ~41 ms a sweep, 4 ~16 ms).
    names.ACTIVE_INDEX_SHARDS_SETTING: "4",
    "AGENT_BACKOFF_INITIAL_SECONDS": "0.05",
    "AGENT_BACKOFF_MAX_SECONDS": "0.3",
    "REMOTE_CALL_TIMEOUT_SECONDS": "1",
    # Should a run of transient faults open an agent's circuit breaker, its steps wait this long.
    "BREAKER_OPEN_SECONDS": "1",
    # Metric points reach each host's metrics file every second (spans: within a second by default).
    "OTEL_METRIC_EXPORT_INTERVAL": "1000",
}

#: The scheduler's log line for every claim of a line (scheduler/dispatch.py).
_CLAIM = re.compile(r"order (\S+) attempt (\d+): (action|compensation) (\S+) \((\S+)\) claimed by (\S+)")
#: The scheduler's log line for a response it did not apply, and the edge's for one it
#: dropped as untrusted (its fence is not the line it names: adapters/wiring.py).
_IGNORED = re.compile(r"response for order (\S+) attempt (-?\d+) ignored|agent_response \S+ for order (\S+) dropped")
#: The workflow's actions at each remote service (core/workflow.py).
ACTIONS = {"inventory": "reserve", "payments": "charge", "shipping": "ship"}


@dataclass(frozen=True)
class Claim:
    """One claim of a line, as the scheduler logged it."""

    order_id: str
    attempt: int
    kind: str
    step: str
    action: str
    instance: str


@dataclass
class Stack:
    settings: dict[str, str]
    emulator: object
    remote: object
    funchost: object
    hosts: list = field(default_factory=list)
    #: The app settings the hosts were last started with (FAST and the test's overrides).
    host_settings: dict[str, str] = field(default_factory=dict)

    @property
    def connection_string(self) -> str:
        return self.emulator.connection_string

    def start_hosts(self, count: int = 1, *, app_dir=None, **overrides: str):
        """Host processes with the FAST timings (and ``overrides``), for the app or, with
        ``app_dir``, another script root; each writes its spans and metric points to files
        of its own (:meth:`spans`, :meth:`metric_points`), as the local stack's hosts do."""
        env = {**FAST, **overrides}
        self.host_settings = env
        started = []
        for _ in range(count):
            n = len(self.funchost.hosts) + 1
            files = {
                names.SPANS_FILE_SETTING: str(self.funchost.log_dir / f"spans-{n}.jsonl"),
                names.METRICS_FILE_SETTING: str(self.funchost.log_dir / f"metrics-{n}.jsonl"),
                # Every host's spans, for the operator page's timeline (api/ops.py).
                names.TRACE_SPANS_FILES_SETTING: str(Path(glob.escape(str(self.funchost.log_dir))) / "spans-*.jsonl"),
            }
            started += self.funchost.start(count=1, env={**env, **files}, app_dir=app_dir, wait=False)
        for host in started:
            host.wait_ready()
        self.hosts += started
        return started

    # -- sending ----------------------------------------------------------------------

    def send(
        self, orders: Iterable[tuple[str, bytes]], *, reply_to: str | None = None, properties: dict | None = None
    ) -> None:
        """Order messages as a client sends them (``properties``: application properties,
        e.g. the client's ``traceparent``)."""
        messages = [
            ServiceBusMessage(
                body, message_id=order_id, content_type="application/json", reply_to=reply_to,
                application_properties=properties,
            )
            for order_id, body in orders
        ]
        client = ServiceBusClient.from_connection_string(self.connection_string)
        try:
            sender = client.get_queue_sender(self.settings["ORDERS_QUEUE"])
            for start in range(0, len(messages), 100):
                sender.send_messages(messages[start : start + 100])
        finally:
            close_later(client)  # sent: the close's wait on the SDK's keep-alive thread is nobody's

    def send_responses(self, responses: Iterable[AgentResponse]) -> None:
        """Agent responses on the agent-responses queue, as an agent sends them."""
        messages = [
            ServiceBusMessage(
                r.model_dump_json(), content_type="application/json", correlation_id=r.order_id,
                message_id=f"{agent_request_id(r.order_id, r.step, r.attempt)}:response",
            )
            for r in responses
        ]
        client = ServiceBusClient.from_connection_string(self.connection_string)
        try:
            client.get_queue_sender(self.settings["AGENT_RESPONSES_QUEUE"]).send_messages(messages)
        finally:
            close_later(client)

    # -- the state, as an operator reads it -------------------------------------------------

    def state(self, order_id: str) -> OrderState | None:
        try:
            return services().store.get(order_id)
        except OrderNotFound:
            return None

    def record(self, order_id: str) -> OrderRecord:
        """The order, its state row and its step rows (what ``ordersctl status`` reads)."""
        return services().store.read(order_id)

    def lines(self, order_id: str) -> dict[tuple[str, str], LineRecord]:
        """The order's step rows by (step, kind): ("charge", "action"), ("reserve", "compensation")..."""
        return {(line.step, line.kind.value): line for line in self.record(order_id).lines}

    def states(self, order_ids: Iterable[str]) -> dict[str, OrderState | None]:
        wanted = set(order_ids)
        if len(wanted) <= 5:
            return {order_id: self.state(order_id) for order_id in wanted}
        found = {s.order_id: s for s in services().store.list_states() if s.order_id in wanted}  # one scan
        return {order_id: found.get(order_id) for order_id in wanted}

    def wait_terminal(self, order_ids: list[str], *, timeout: float) -> dict[str, OrderState]:
        def all_terminal():
            states = self.states(order_ids)
            if all(s is not None and s.process_state.terminal for s in states.values()):
                return states
            return None

        # Many orders: poll less often, each poll scans the table (on the same two cores as the hosts).
        interval = 0.25 if len(order_ids) <= 5 else 1.0
        return wait_until(all_terminal, timeout=timeout, what=f"{len(order_ids)} order(s) to finish", interval=interval)

    def wait_closed(self, order_ids: list[str], *, timeout: float) -> dict[str, OrderState]:
        """Terminal and out of the active index: the order was closed, so its final status
        event and any alert have been sent (adapters/closing.py sends them first)."""
        states = self.wait_terminal(order_ids, timeout=timeout)
        wanted = set(order_ids)
        wait_until(
            lambda: not wanted & {order_id for order_id, _, _ in services().store.active_ids()},
            timeout=15, what=f"{len(order_ids)} order(s) to be closed",
        )
        return states

    def capture(self, order_id: str, step: str, kind: Kind = Kind.ACTION, *, timeout: float = 20) -> OrderRecord:
        """Wait until the line (step, kind) is in flight and return the partition as read
        then: its state row is the line's claim, with the claim's ETag, i.e. the fence the
        real agent request carries (nothing writes the row while the line runs)."""

        def in_flight() -> OrderRecord | None:
            try:
                record = self.record(order_id)
            except OrderNotFound:
                return None
            s = record.state
            running = s.process_state is ProcessState.PROCESSING and s.step == step and s.kind is kind
            if s.group:  # a group in flight: that line of it with its agent
                running = kind is Kind.ACTION and any(
                    line.step == step and line.state is LineRun.PROCESSING for line in s.group
                )
            return record if running else None

        what = f"order {order_id}: {kind.value} {step} in flight"
        return wait_until(in_flight, timeout=timeout, what=what, interval=0.03)

    @staticmethod
    def response(captured: OrderRecord, outcome: Outcome = Outcome.SUCCEEDED, **changes) -> AgentResponse:
        """The response an agent sends for the captured line: its step, kind and attempt,
        and the request's context (the fence, the order, the results so far) echoed."""
        s = captured.state
        fields = {
            "order_id": s.order_id, "step": s.step, "kind": s.kind, "attempt": s.attempt, "outcome": outcome,
            "context": Context(fence=s, order=json.loads(captured.document), results=captured.results()),
        }
        return AgentResponse(**{**fields, **changes})

    def assert_within_bound(
        self, order_id: str, submitted_at: datetime, *, outage: timedelta = timedelta(0),
        outage_remote: str | None = None,
    ) -> timedelta:
        """The order is terminal, and it got there within the liveness bound
        (core.liveness.order_bound, docs/workflows.md "How long an order can take") computed
        from the hosts' own settings. Measured from ``submitted_at``, which is earlier than
        any line's first failure, against the bound from the first action's first failure
        (every line of the order may still run): conservative. Returns the time it took."""
        state = self.state(order_id)
        assert state is not None and state.process_state.terminal, f"order {order_id} is not terminal: {state}"
        settings = Settings(**self.host_settings)
        definition = workflow(state.workflow, state.workflow_version)
        bound = liveness.order_bound(
            definition, settings.step_defaults(), liveness_timing(settings), outage=outage, outage_remote=outage_remote,
        )
        took = state.updated_at - submitted_at
        assert took <= bound, f"order {order_id} took {took.total_seconds():.1f} s, over its bound {bound}"
        return took

    # -- what the hosts logged ----------------------------------------------------------

    def host_logs(self) -> str:
        return "\n".join(host.log_text() for host in self.hosts)

    def claims(self, order_id: str | None = None) -> list[Claim]:
        """Every claim the scheduler logged (of one order), in attempt order."""
        found = [
            Claim(m[1], int(m[2]), m[3], m[4], m[5], m[6])
            for host in self.hosts
            for m in _CLAIM.finditer(host.log_text())
            if order_id is None or m[1] == order_id
        ]
        return sorted(found, key=lambda c: (c.order_id, c.attempt))

    def ignored(self, order_id: str) -> int:
        """Responses for this order the scheduler logged as ignored (stale or duplicate), or
        the edge dropped as untrusted (a fence that is not the line the response names)."""
        return sum(1 for host in self.hosts for m in _IGNORED.finditer(host.log_text()) if order_id in (m[1], m[3]))

    # -- what the hosts traced and measured --------------------------------------------------

    def spans(self, order_id: str | None = None) -> list[dict]:
        """Every span the hosts exported so far (of one order: those with its ``order.id``)."""
        found = telemetry.read_json_lines(sorted(self.funchost.log_dir.glob("spans-*.jsonl")))
        if order_id is None:
            return found
        return [span for span in found if span["attributes"].get(names.ATTR_ORDER_ID) == order_id]

    def trace(self, trace_id: str) -> list[dict]:
        """Every span of one trace, in the order they ended."""
        return [span for span in self.spans() if span["trace_id"] == trace_id]

    def metric_points(self) -> list[dict]:
        """Every metric point the hosts wrote (cumulative; the last of a series is its total)."""
        return telemetry.read_json_lines(sorted(self.funchost.log_dir.glob("metrics-*.jsonl")))

    def metric(self, name: str, attributes: dict[str, str] | None = None) -> float:
        """A counter's total over the hosts, for the series whose attributes include these."""
        last: dict[tuple, float] = {}
        for point in self.metric_points():
            wanted = (attributes or {}).items()
            if point["name"] == name and all(point["attributes"].get(k) == v for k, v in wanted):
                last[(point["instance"], tuple(sorted(point["attributes"].items())))] = point["value"]
        return sum(last.values())

    # -- what the app sent ----------------------------------------------------------------

    def waiting(self, queue: str) -> int:
        """Messages on a queue, not yet received."""
        counts = self.emulator.message_counts(queue)
        return counts["active"] + counts["locked"] + counts["scheduled"]

    def all_alerts(self) -> list[dict]:
        """Every alert on the alerts queue (received and removed). Call after wait_closed."""
        queue = self.settings["ALERTS_QUEUE"]
        count = self.waiting(queue)
        return bodies(receive(self.connection_string, queue, count, timeout=10)) if count else []

    def events(self, queue: str) -> list[tuple[str, str | None]]:
        """Every status event on a reply queue as (status, step), in order (received and
        removed). Call after wait_closed: the order's last event has been sent."""
        count = self.waiting(queue)
        received = bodies(receive(self.connection_string, queue, count, timeout=10)) if count else []
        return [(event["status"], event.get("step")) for event in received]

    # -- what the remote services saw -----------------------------------------------------

    def applied(self, service: str) -> dict[str, list[str]]:
        """Forward actions applied at a service, by order."""
        return self.remote.effects()["services"][service]["applied"]

    def undone(self, service: str) -> dict[str, list[str]]:
        """Compensations that undid something at a service, by order."""
        return self.remote.effects()["services"][service]["undone"]

    def assert_remote_clean(self) -> dict:
        """Nothing applied twice, no call after its complete-by, no call the remote found invalid."""
        effects = self.remote.effects()
        assert (effects["twice"], effects["late"], effects["invalid"]) == (0, 0, 0), {
            name: {k: s[k] for k in ("twice", "late", "invalid")} for name, s in effects["services"].items()
        }
        return effects


@pytest.fixture
def stack(app_settings, servicebus_emulator, fake_remote, funchost) -> Stack:
    return Stack(app_settings, servicebus_emulator, fake_remote, funchost)


@pytest.fixture
def reply_queue(stack, unique_name) -> str:
    """A queue of the test's own for status events (the submitter's ReplyTo)."""
    return stack.emulator.declare_queue(unique_name("replies-"))


def processed(states: dict[str, OrderState]) -> int:
    return sum(1 for s in states.values() if s.process_state is ProcessState.PROCESSED)


def net_zero(net: dict[str, dict[str, int]]) -> bool:
    """Nothing of the order is left applied at any service."""
    return all(count == 0 for actions in net.values() for count in actions.values())
