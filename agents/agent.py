"""One agent request in, at most one response out.

The agent never acts past complete-by: a request that arrives late, or a step whose
retries reach the deadline, produces no response at all. The supervisor sees the
expired row and decides whether the step runs again (with the same idempotency key).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from adapters import telemetry
from agents.breaker import BreakerOpen
from agents.remote import DeadlineReached, PermanentRemoteError, RemoteClient, TransientRemoteError
from core.models import AgentRequest, AgentResponse, Outcome

log = logging.getLogger(__name__)


async def run(request: AgentRequest, *, remote: RemoteClient, now: Callable[[], datetime]) -> AgentResponse | None:
    if now() >= request.complete_by:
        log.warning(
            "order %s attempt %s (%s %s) arrived past complete-by: not acting",
            request.order_id, request.attempt, request.kind.value, request.step,
        )
        telemetry.error("arrived past complete-by: not acting")
        return None
    try:
        if request.settle_first:
            # The last attempt's outcome is unknown: ask before sending the action again.
            settled = await remote.lookup(request, now=now)
            if settled is not None:
                log.info("order %s %s %s: already applied, settled by lookup", request.order_id, request.kind.value, request.step)
                return _response(request, Outcome.SUCCEEDED, result=settled)
        result = await remote.call(request, now=now)
    except BreakerOpen as error:
        # The service is down for everyone and this attempt could not call at all: the
        # line neither ran nor failed; it waits and runs again. (An attempt whose own call
        # failed before the breaker refused it ends below, counted by its own policy.)
        log.warning("order %s %s %s postponed: %s", request.order_id, request.kind.value, request.step, error)
        return _response(request, Outcome.POSTPONED, error=str(error), retry_after_seconds=error.retry_after)
    except PermanentRemoteError as error:
        telemetry.error(f"refused: {error}")
        return _response(request, Outcome.FAILED_PERMANENT, error=str(error))
    except (DeadlineReached, TransientRemoteError) as error:
        log.warning(
            "order %s attempt %s: no result before complete-by (%s); sending nothing",
            request.order_id, request.attempt, error,
        )
        telemetry.error(f"no result before complete-by: {error}")
        return None
    return _response(request, Outcome.SUCCEEDED, result=result)


def _response(request: AgentRequest, outcome: Outcome, **fields) -> AgentResponse:
    return AgentResponse(
        order_id=request.order_id,
        step=request.step,
        kind=request.kind,
        attempt=request.attempt,
        outcome=outcome,
        context=request.context,
        **fields,
    )
