"""Binding of the agent function."""

from __future__ import annotations

import logging
import threading

import azure.functions as func

from agents import agent
from agents.remote import RemoteClient, RetryPolicy
from core import names
from core.models import AgentRequest, utcnow
from adapters.settings import Settings
from adapters.wiring import services

log = logging.getLogger(__name__)
bp = func.Blueprint()

_remote: RemoteClient | None = None
_lock = threading.Lock()


def remote_client(settings: Settings) -> RemoteClient:
    global _remote
    with _lock:
        if _remote is None:
            _remote = RemoteClient(
                settings.remote_service_url,
                RetryPolicy(
                    max_calls=settings.agent_max_calls,
                    backoff_initial=settings.agent_backoff_initial_seconds,
                    backoff_max=settings.agent_backoff_max_seconds,
                    call_timeout=settings.remote_call_timeout_seconds,
                ),
            )
        return _remote


@bp.function_name("run_agent")
@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=f"%{names.AGENT_REQUESTS_QUEUE_SETTING}%", connection=names.SERVICEBUS_CONNECTION
)
def run_agent(msg: func.ServiceBusMessage) -> None:
    s = services()
    try:
        request = AgentRequest.model_validate_json(msg.get_body())
    except ValueError as error:
        log.error("malformed agent request %s ignored: %s", msg.message_id, error)
        return
    response = agent.run(request, remote=remote_client(s.settings), now=utcnow)
    if response is not None:
        s.publisher.send_agent_response(response, queue=msg.reply_to or s.settings.agent_responses_queue)
