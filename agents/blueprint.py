"""Bindings of the agent functions: one per remote service (``run_<remote>_agent``), each
on its own request queue, so a slow service cannot starve the others."""

from __future__ import annotations

import threading

import azure.functions as func

from adapters.settings import Settings
from adapters.wiring import parse_or_drop, services
from agents import agent
from agents.remote import RemoteClient
from core import names
from core.models import AgentRequest, utcnow
from core.workflow import remotes

bp = func.Blueprint()

_clients: dict[str, RemoteClient] = {}
_lock = threading.Lock()


def remote_client(settings: Settings, remote: str) -> RemoteClient:
    """One client per remote service per process (it pools connections)."""
    with _lock:
        if remote not in _clients:
            _clients[remote] = RemoteClient(
                settings.remote_url(remote), call_timeout=settings.remote_call_timeout_seconds
            )
        return _clients[remote]


def handle(msg: func.ServiceBusMessage, remote: str) -> None:
    request = parse_or_drop(AgentRequest, msg.get_body(), what="agent request", message_id=msg.message_id)
    if request is None:
        return
    s = services()
    response = agent.run(request, remote=remote_client(s.settings, remote), now=utcnow)
    if response is not None:
        s.publisher.send_agent_response(response, queue=msg.reply_to or s.settings.agent_responses_queue)


def _register(remote: str) -> None:
    def run_agent(msg: func.ServiceBusMessage) -> None:
        handle(msg, remote)

    run_agent.__name__ = run_agent.__qualname__ = names.agent_function(remote)
    bp.function_name(names.agent_function(remote))(
        bp.service_bus_queue_trigger(
            arg_name="msg",
            queue_name=f"%{names.requests_queue_setting(remote)}%",
            connection=names.SERVICEBUS_CONNECTION,
        )(run_agent)
    )


for _remote in remotes():
    _register(_remote)
