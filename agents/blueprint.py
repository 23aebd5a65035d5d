"""Bindings of the agent functions: one per remote service (``run_<remote>_agent``), each
on its own request queue, so a slow service cannot starve the others.

The agents are ``async``: a call to a remote service waits on the network, and its
retries back off, for up to the step's timeout. As sync functions they would hold a
thread of the worker's one shared pool all that time (``min(32, cores + 4)`` threads;
see tools/funchost/README.md), and on a small instance requests would queue up in the
worker until they arrive past complete-by. Async, they hold nothing while they wait.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import azure.functions as func

from adapters import clients, telemetry
from adapters.messaging import AsyncPublisher
from adapters.settings import Settings, get_settings
from adapters.wiring import instance_id, parse_or_drop, services
from agents import agent
from agents.breaker import BreakerOptions, BreakerState, CircuitBreaker
from agents.remote import RemoteClient
from core import claims, names
from core.models import AgentRequest, queue_key, utcnow
from core.workflow import remotes

log = logging.getLogger(__name__)

bp = func.Blueprint()


@dataclass
class AgentRuntime:
    """The agents' collaborators on one event loop, built on first use and reused."""

    settings: Settings
    publisher: AsyncPublisher
    clients: dict[str, RemoteClient] = field(default_factory=dict)

    def remote(self, remote: str) -> RemoteClient:
        """One client per remote service per instance, with its circuit breaker and bulkhead."""
        if remote not in self.clients:
            s = self.settings
            self.clients[remote] = RemoteClient(
                s.remote_url(remote),
                call_timeout=s.remote_call_timeout_seconds,
                breaker=CircuitBreaker(remote, breaker_options(s), on_change=_breaker_changed),
                max_concurrent_calls=s.remote_max_concurrent_calls,
            )
        return self.clients[remote]


def breaker_options(settings: Settings) -> BreakerOptions:
    """The breakers' options from the app settings (BREAKER_*)."""
    return BreakerOptions(
        failure_ratio=settings.breaker_failure_ratio,
        minimum_throughput=settings.breaker_minimum_throughput,
        sampling_seconds=settings.breaker_sampling_seconds,
        open_seconds=settings.breaker_open_seconds,
    )


#: Publishes breaker changes one at a time, in the order they happened (a change to
#: half-open and the close that follows come milliseconds apart: in parallel, the older
#: write could land last and leave a stale state published).
_publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="breaker-publish")


def _breaker_changed(remote: str, state: BreakerState) -> None:
    """Count the change, and publish it for ``ordersctl breakers`` (one table write, in
    order, off the event loop and outside the breaker's lock: the services, which an
    instance that runs only agents builds here first, and their storage calls with it; a
    failure is logged, the breaker and the call that changed it go on regardless)."""
    telemetry.breaker_changed(remote, state)
    at = utcnow()

    def publish() -> None:
        try:
            s = services()
            s.store.publish_breaker(remote, s.instance, state.value, at)
        except Exception:  # noqa: BLE001 - publishing is for operators; the agent goes on
            log.warning("could not publish the %s breaker's state %s", remote, state.value, exc_info=True)

    _publisher.submit(publish)


_runtimes: dict[asyncio.AbstractEventLoop, AgentRuntime] = {}


def runtime() -> AgentRuntime:
    loop = asyncio.get_running_loop()
    if loop not in _runtimes:
        settings = get_settings()
        telemetry.configure(settings, instance_id())  # once per process
        _runtimes[loop] = AgentRuntime(settings, AsyncPublisher(clients.async_servicebus_client(settings)))
    return _runtimes[loop]


async def handle(msg: func.ServiceBusMessage, remote: str) -> None:
    # A request that cannot be acted on (malformed, or naming a step, action or remote the
    # workflow does not have for this agent) is dropped with a log line and counted, like
    # every internal message (docs/failure-handling.md): its line, if real, times out.
    request = parse_or_drop(
        AgentRequest, msg.get_body(), what="agent_request", message_id=msg.message_id,
        check=lambda r: claims.check_request(r, remote),
    )
    if request is None:
        return
    r = runtime()
    parent = telemetry.parent_from_properties(msg.application_properties) or telemetry.parent_from_traceparent(
        request.context.fence.trace_parent
    )
    with telemetry.entry(
        names.SPAN_AGENT, parent, order_id=request.order_id, step=request.step, kind=request.kind,
        attempt=request.attempt, remote=request.remote, action=request.action,
    ):
        response = await agent.run(request, remote=r.remote(remote), now=utcnow)
        telemetry.annotate(outcome=response.outcome if response is not None else "no_response")
        if response is not None:
            # Always to the app's own responses queue: a request's ReplyTo is a claim like the
            # rest of it, and one naming another queue (alerts, orders) would misroute the answer.
            queue = r.settings.agent_responses_queue
            if msg.reply_to and queue_key(str(msg.reply_to)) != queue_key(queue):
                log.warning("agent request %s names ReplyTo %r: answered on %s", msg.message_id, msg.reply_to, queue)
            await r.publisher.send_agent_response(response, queue=queue)


def bind(blueprint: func.Blueprint, remote: str, run_agent) -> None:
    """Register ``run_agent`` as ``remote``'s agent function, on its request queue."""
    run_agent.__name__ = run_agent.__qualname__ = names.agent_function(remote)
    blueprint.function_name(names.agent_function(remote))(
        blueprint.service_bus_queue_trigger(
            arg_name="msg",
            queue_name=f"%{names.requests_queue_setting(remote)}%",
            connection=names.SERVICEBUS_CONNECTION,
            data_type=func.DataType.BINARY,  # the body as sent (see scheduler/blueprint.py)
        )(run_agent)
    )


def _register(remote: str) -> None:
    async def run_agent(msg: func.ServiceBusMessage) -> None:
        await handle(msg, remote)

    bind(bp, remote, run_agent)


for _remote in remotes():
    _register(_remote)
