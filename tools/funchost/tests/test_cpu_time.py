"""The CPU time a function itself used, as the invocation's log line reports it (``Cpu=``):
its thread's CPU clock while it ran, not the time it waited, nor other invocations' work."""

from __future__ import annotations

import asyncio
import threading
import time

from tools.funchost.invoke import Context, CpuTime, Worker

BURN = 0.05  # CPU seconds a busy function uses
WAIT = 0.3  # seconds a waiting function sleeps


def _burn(seconds: float) -> None:
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


def _context() -> Context:
    return Context("inv-1", "f", ".")


def _worker() -> Worker:
    return Worker({"PYTHON_THREADPOOL_THREAD_COUNT": "4"})


def test_a_sync_function_is_charged_its_own_cpu_not_its_waits():
    worker = _worker()
    try:
        busy, idle = CpuTime(), CpuTime()
        worker.run_sync(lambda: _burn(BURN), {}, _context(), busy)
        started = time.monotonic()
        worker.run_sync(lambda: time.sleep(WAIT), {}, _context(), idle)
        assert time.monotonic() - started >= WAIT
    finally:
        worker.close()
    assert BURN <= busy.seconds < BURN + 0.05
    assert idle.seconds < 0.02


def test_an_async_function_is_charged_its_own_steps_not_its_awaits_nor_the_others():
    worker = _worker()
    results: dict[str, object] = {}

    async def busy_then_wait() -> str:
        _burn(BURN)
        await asyncio.sleep(WAIT / 2)
        _burn(BURN)
        return "done"

    async def waiting() -> str:
        await asyncio.sleep(WAIT)
        return "waited"

    def run(name: str, coroutine, cpu: CpuTime) -> None:
        results[name] = worker.run_async(coroutine, cpu)

    try:
        busy, idle = CpuTime(), CpuTime()
        # Both at once on the one event loop: the waiting one is not charged the busy one's steps.
        threads = [threading.Thread(target=run, args=("busy", busy_then_wait(), busy)),
                   threading.Thread(target=run, args=("idle", waiting(), idle))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        worker.close()
    assert results == {"busy": "done", "idle": "waited"}
    assert 2 * BURN <= busy.seconds < 2 * BURN + 0.05
    assert idle.seconds < 0.02


def test_an_async_function_that_raises_still_raises_through_the_timing():
    worker = _worker()

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("refused")

    cpu = CpuTime()
    try:
        try:
            worker.run_async(fails(), cpu)
        except ValueError as error:
            assert str(error) == "refused"
        else:
            raise AssertionError("the function's error was swallowed")
    finally:
        worker.close()
