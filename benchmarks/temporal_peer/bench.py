"""The peer's runs, measured as :mod:`benchmarks.pipeline` measures the app's: orders
started like a client starts them, each running the saga; an order is done when its
workflow closed, at the server's close time (as the app's is at the Processed row's
commit time, Azurite's clock: both on this machine's clock), from the send time taken
here. Process CPU from /proc (:class:`benchmarks.procstat.CpuMeter`), the figures in a
:class:`benchmarks.pipeline.RunResult`.
"""

from __future__ import annotations

import asyncio
import json
import time

from temporalio.client import Client, WorkflowExecutionStatus

from benchmarks.pipeline import STEPS, RunResult, Timeout, arrivals, completions, wait_applied
from benchmarks.procstat import CpuMeter
from benchmarks.temporal_peer.saga import TASK_QUEUE, WORKFLOW, SagaInput, SagaResult
from benchmarks.temporal_peer.stack import TemporalStack
from devtools.orders import order_body

#: Workflow starts in flight at once from the client (a burst is sent as fast as this allows).
SEND_CONCURRENCY = 64


def saga_input(order_id: str, i: int) -> SagaInput:
    """The ``i``-th order of a run, the same document the app's runs send (``order_body``)."""
    return SagaInput(order_id, json.loads(order_body(order_id, i)))


async def start(client: Client, order_id: str, i: int):
    """Start one order's saga (the workflow id is the order id: one run per order)."""
    return await client.start_workflow(WORKFLOW, saga_input(order_id, i), id=order_id, task_queue=TASK_QUEUE,
                                       result_type=SagaResult)


async def send(client: Client, order_ids: list[str], start_index: int = 0) -> dict[str, float]:
    """Start the orders' sagas, up to :data:`SEND_CONCURRENCY` at once; each order's send time (epoch s)."""
    sent: dict[str, float] = {}
    gate = asyncio.Semaphore(SEND_CONCURRENCY)

    async def one(n: int, order_id: str) -> None:
        async with gate:
            sent[order_id] = time.time()
            await start(client, order_id, start_index + n)

    await asyncio.gather(*(one(n, order_id) for n, order_id in enumerate(order_ids)))
    return sent


def _prefix_query(prefix: str, status: str | None = None) -> str:
    query = f'WorkflowType = "{WORKFLOW}" AND WorkflowId STARTS_WITH "{prefix}"'
    return query + (f' AND ExecutionStatus = "{status}"' if status else "")


async def wait_done(stack: TemporalStack, client: Client, prefix: str, count: int, effects_before: int, *,
                    timeout: float, interval: float = 0.25, progress=None) -> bool:
    """Until every order of the run is finished: every step's remote effect applied
    (:func:`benchmarks.pipeline.wait_applied`), then no workflow of the run still running
    (one visibility count), as :func:`benchmarks.pipeline.wait_done` waits for the app's."""
    deadline = time.monotonic() + timeout
    if not await asyncio.to_thread(wait_applied, stack.remote, count, effects_before, deadline=deadline,
                                   interval=interval, progress=progress):
        return False
    while (await client.count_workflows(_prefix_query(prefix, "Running"))).count:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True


async def _finish(result: RunResult, stack: TemporalStack, client: Client, prefix: str, sent: dict[str, float],
                  first_send: float) -> None:
    """An order is done (Processed) when its workflow completed with every step applied at
    the remote once; failed, timed-out or terminated workflows count as errors."""
    applied = stack.remote.effects()["by_order"]
    done: dict[str, float] = {}
    async for execution in client.list_workflows(_prefix_query(prefix)):
        if execution.id not in sent:
            continue
        if execution.status is WorkflowExecutionStatus.COMPLETED and applied.get(execution.id) == STEPS:
            done[execution.id] = execution.close_time.timestamp()
        elif execution.status not in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.COMPLETED):
            result.errors += 1
    completions(result, sent, done, first_send)


async def warm_up(stack: TemporalStack, client: Client, prefix: str, count: int = 20, timeout: float = 60) -> None:
    """A few orders through every worker, so connections are open and the workflow code loaded."""
    before = stack.remote.effects()["total"]
    await send(client, [f"{prefix}{i:05d}" for i in range(count)])
    if not await wait_done(stack, client, prefix, count, before, timeout=timeout):
        raise Timeout(f"warm-up orders of the Temporal peer were not done within {timeout:.0f} s "
                      f"(see the logs in {stack.log_dir})")


async def throughput(stack: TemporalStack, client: Client, prefix: str, count: int, *, timeout: float,
                     progress=None) -> RunResult:
    """Start ``count`` orders at once; orders/s from the first send to the last close, and the
    CPU of the server and the workers over the run (:func:`benchmarks.pipeline.throughput`)."""
    ids = [f"{prefix}{i:05d}" for i in range(count)]
    result = RunResult(count)
    meter = CpuMeter(stack.pids)
    effects_before = stack.remote.effects()["total"]
    meter.start()
    first_send = time.time()
    sent = await send(client, ids)
    finished = await wait_done(stack, client, prefix, count, effects_before, timeout=timeout, progress=progress)
    result.cpu = meter.stop()
    result.wall = result.cpu.pop("wall")
    await _finish(result, stack, client, prefix, sent, first_send)
    if not finished:
        result.seconds = time.time() - first_send
    return result


async def steady(stack: TemporalStack, client: Client, prefix: str, *, rate: float, seconds: float, timeout: float,
                 progress=None) -> RunResult:
    """One order every 1/rate seconds for ``seconds``; each one's latency, send -> closed
    (:func:`benchmarks.pipeline.steady`)."""
    count = max(1, int(rate * seconds))
    result = RunResult(count)
    effects_before = stack.remote.effects()["total"]
    sent: dict[str, float] = {}
    first_send = time.time()
    for i, wait in arrivals(count, rate):
        await asyncio.sleep(wait)
        sent.update(await send(client, [f"{prefix}{i:05d}"], start_index=i))
        if progress is not None:
            progress(i + 1)
    await wait_done(stack, client, prefix, count, effects_before, timeout=timeout)
    await _finish(result, stack, client, prefix, sent, first_send)
    return result
