"""Binding of the supervisor's timer."""

from __future__ import annotations

import logging

import azure.functions as func

from core import names
from core.models import utcnow
from adapters.wiring import services
from supervisor.supervision import policy_from, sweep

log = logging.getLogger(__name__)
bp = func.Blueprint()


@bp.function_name("supervise")
@bp.timer_trigger(arg_name="timer", schedule=f"%{names.SUPERVISOR_SCHEDULE_SETTING}%", run_on_startup=False)
def supervise(timer: func.TimerRequest) -> None:
    s = services()
    if timer.past_due:
        log.info("supervisor timer is past due; sweeping now")
    sweep(
        store=s.store,
        publisher=s.publisher,
        nudger=s.nudger,
        policy=policy_from(s.settings),
        now=utcnow(),
        alerts_queue=s.settings.alerts_queue,
        responses_since=lambda: s.publisher.oldest_enqueued(s.settings.agent_responses_queue),
    )
