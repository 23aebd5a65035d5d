"""One Temporal worker process of the peer: ``python -m benchmarks.temporal_peer.worker
--address 127.0.0.1:PORT --remote-url URL``. It runs the saga's workflow and activity
with the SDK's default worker settings (sandboxed workflows, eager activity execution,
the default task slots and pollers), prints :data:`READY` once it polls, and stops
gracefully on SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import signal

from temporalio.client import Client
from temporalio.worker import Worker

from benchmarks.temporal_peer.activities import RemoteActivities
from benchmarks.temporal_peer.saga import TASK_QUEUE
from benchmarks.temporal_peer.workflows import OrderSaga

#: The line a worker prints on stdout once it is polling its task queue.
READY = "temporal worker ready"


async def run(address: str, remote_url: str, task_queue: str) -> None:
    client = await Client.connect(address)
    activities = RemoteActivities(remote_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with Worker(client, task_queue=task_queue, workflows=[OrderSaga], activities=[activities.call_remote]):
            print(READY, flush=True)
            await stop.wait()
    finally:
        await activities.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", required=True, help="the Temporal frontend, HOST:PORT")
    parser.add_argument("--remote-url", required=True, help="the remote services' root: remote NAME at {url}/{NAME}")
    parser.add_argument("--task-queue", default=TASK_QUEUE)
    args = parser.parse_args()
    asyncio.run(run(args.address, args.remote_url, args.task_queue))


if __name__ == "__main__":
    main()
