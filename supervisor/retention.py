"""Binding of the retention timer (adapters/retention.py does the work; docs/retention.md)."""

from __future__ import annotations

import logging
import os

import azure.functions as func

from adapters.retention import RetentionPolicy, tick
from adapters.wiring import services
from core import names
from core.models import utcnow

log = logging.getLogger(__name__)
bp = func.Blueprint()


def _crash() -> None:
    """RETENTION_FAULT=exit-after-archive (local tests only): the process ends here, after
    the archive step and before any delete, as a host that crashed there would."""
    log.error("RETENTION_FAULT=%s: ending the process after the archive step", names.RETENTION_FAULT_EXIT)
    logging.shutdown()
    os._exit(70)


@bp.function_name("retention")
@bp.timer_trigger(arg_name="timer", schedule=f"%{names.RETENTION_SCHEDULE_SETTING}%", run_on_startup=False)
def retention(timer: func.TimerRequest) -> None:
    s = services()
    tick(
        store=s.store, archive=s.archive(), policy=RetentionPolicy.from_settings(s.settings), now=utcnow(),
        after_archive=_crash if s.settings.retention_fault == names.RETENTION_FAULT_EXIT else None,
    )
