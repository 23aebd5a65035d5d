"""Timer trigger: NCRONTAB with seconds (or a TimeSpan), ``run_on_startup``, ``past_due``.

The function runs at each occurrence of its schedule (UTC). Runs of one timer never
overlap. As Azure's ``TimerListener`` (azure-webjobs-sdk-extensions,
``Extensions/Timers/Listener/TimerListener.cs``), the next occurrence is reckoned from
when a run started (or from the occurrence it ran for, if it started early): when a run
outlasts the interval, the occurrence it overran fires as soon as it ends, once, and
the ones after it are skipped. ``past_due`` is false for every scheduled run, as there:
Azure sets it only for the start-up run its schedule monitor makes up for a missed
occurrence, which is not emulated (below).

Not emulated: the schedule monitor that, in Azure, persists the last occurrence in
storage and runs a missed one after a restart; and the singleton lock that keeps a
timer to one instance at a time (each host process here fires its own timers).
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import UTC, datetime, timedelta

from .app import FunctionSpec
from .invoke import Invoker, TriggerValue
from .listener import Listener
from .rpc import protos
from .schedule import CronSchedule, Schedule, parse_schedule

log = logging.getLogger("funchost")


def _now() -> datetime:
    return datetime.now(UTC)


class TimerTriggerListener(Listener):
    def __init__(self, spec: FunctionSpec, invoker: Invoker) -> None:
        super().__init__(spec, invoker)
        self.expression = str(spec.trigger.get("schedule") or "")
        self.run_on_startup = bool(spec.trigger.get("runOnStartup"))
        self._use_monitor = spec.trigger.get("useMonitor")
        self._signal = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"timer-{spec.name}")
        self.schedule: Schedule | None = None
        self._last: datetime | None = None

    def describe(self) -> str:
        return f'{self.spec.trigger_type} schedule="{self.expression}"'

    def concurrency(self) -> str:
        return "1 (runs never overlap)"

    def prepare(self) -> None:
        self.schedule = parse_schedule(self.expression)
        if self._use_monitor is None:
            # Azure turns monitoring off by default for schedules more frequent than a minute.
            first = self.schedule.next_after(_now())
            self._use_monitor = self.schedule.next_after(first) - first >= timedelta(minutes=1)

    def _wake(self) -> None:
        self._signal.set()

    def _run(self) -> None:
        assert self.schedule is not None
        self.ready.set()
        if self.run_on_startup and not self._stopping.is_set():
            self._fire(_now(), past_due=False)
        due = self.schedule.next_after(_now())
        while not self._stopping.is_set():
            delay = (due - _now()).total_seconds()
            if delay > 0:
                self._signal.wait(delay)
                self._signal.clear()
                continue
            started = _now()
            self._fire(due, past_due=False)
            due = self.schedule.next_after(max(started, due))
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _fire(self, scheduled: datetime, *, past_due: bool) -> None:
        assert self.schedule is not None
        status = None
        if self._use_monitor:
            status = {
                "Last": (self._last or scheduled).isoformat(),
                "Next": self.schedule.next_after(scheduled).isoformat(),
                "LastUpdated": _now().isoformat(),
            }
        schedule_info = {"AdjustForDST": isinstance(self.schedule, CronSchedule)}
        # The extension's TimerInfo as the host's JSON writer sends it to the worker.
        body = json.dumps({"Schedule": schedule_info, "ScheduleStatus": status, "IsPastDue": past_due})
        details = f"scheduled={scheduled.isoformat(timespec='seconds')} past_due={past_due}"
        # Its one binding data entry: the local time of the run as .NET's DateTime.ToString() writes it (invariant).
        now = {"TimerTrigger": protos.TypedData(string=datetime.now().strftime("%m/%d/%Y %H:%M:%S"))}
        trigger = TriggerValue(protos.TypedData(json=body), now, details)
        future = self._executor.submit(self.invoker.invoke, self.spec, trigger)
        self._last = scheduled
        while not future.done():
            wait([future], timeout=0.5)
            if self._stopping.is_set() and self.remaining() <= 0 and not future.done():
                log.warning("%s: timer run still going at the shutdown deadline; leaving it", self.name)
                return
