"""The local stack as the benchmarks run it: :class:`devtools.localstack.LocalStack`, with

- Azurite optionally writing its debug log (to count storage operations at the server),
- the Service Bus emulator answering for its operation counters on stdin (``--stats-stdin``),
- the processes whose CPU the benchmarks measure, by name (:attr:`BenchStack.pids`): each
  local Functions host process and the worker processes it started, Azurite, the emulator;
- helpers to send orders and to read the state table and the counters.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from azure.data.tables import TableClient
from azure.servicebus import ServiceBusClient

from adapters import clients
from core import names
from adapters.settings import Settings
from benchmarks.procstat import WORKERS, parent_pid, process_group
from devtools import azurite as azurite_launcher
from devtools.localstack import LocalStack, servicebus_queue
from devtools.orders import order_message
from devtools.paths import ROOT
from tools.funchost.testing import FuncHosts, HostProcess
from tools.servicebus_emulator import QueueSettings

#: Extra Service Bus queues the ceiling measurement uses (shaped like agent-responses).
BENCH_QUEUES = ("bench-serial", "bench-parallel", "bench-study")

#: The line a local host logs when one of its worker processes is ready (tools/funchost/README.md,
#: "The host and its workers"): the worker's number (a restarted worker is a new number and process).
_WORKER_READY = re.compile(r"\[funchost\] worker (\d+): ready \(process (\d+)\)")


def host_workers(host: int, host_pid: int, log_text: str) -> dict[str, int]:
    """Host ``host``'s live worker processes by name, from its log (``worker N: ready (process
    PID)``): ``worker-H`` for the first, ``worker-H.2`` and on for the others, in the order they
    became ready. A worker that exited (a crash, a restart) is left out: only processes still
    running as the host's children count, so read this once the workers are ready."""
    pids = [int(match[2]) for match in _WORKER_READY.finditer(log_text)]
    live = [pid for pid in pids if parent_pid(pid) == host_pid]
    return {f"worker-{host}" + (f".{n}" if n > 1 else ""): pid for n, pid in enumerate(live, 1)}


@dataclass
class BenchStack(LocalStack):
    #: Where Azurite writes its debug log (None: no debug log, Azurite at full speed).
    azurite_debug_log: Path | None = None
    #: Start the fake remote service (the ceiling and sweep phases need none).
    with_remote: bool = True

    emulator_stdin = subprocess.PIPE  # the emulator answers "stats" there (--stats-stdin)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._stats_lock = threading.Lock()
        self._tables = None
        self._app_hosts: FuncHosts | None = None

    def start_app_hosts(self, count: int, *, app_dir: Path | None = None, **settings: str) -> list[HostProcess]:
        """Host processes with app settings on top of the stack's (``settings``), running
        the app or, with ``app_dir``, another script root (benchmarks.sync_agents.write_app);
        handles with their own logs. Stopped with the stack's other hosts."""
        if self._app_hosts is None:
            self._app_hosts = FuncHosts(self.log_dir / "app-hosts", app_dir=ROOT)
        return self._app_hosts.start(app_dir or ROOT, count=count, env={**self.env, **settings})

    def stop_hosts(self, timeout: float = 30.0) -> None:
        super().stop_hosts(timeout)
        if self._app_hosts is not None:
            self._app_hosts.stop_all(timeout)

    def _start_azurite(self):
        return azurite_launcher.start(self.storage_ports, debug_log=self.azurite_debug_log)

    def _start_remote(self):
        return super()._start_remote() if self.with_remote else None

    def _emulator_queues(self) -> list[QueueSettings]:
        responses = next(q for q in names.SERVICEBUS_QUEUES if q.name == names.AGENT_RESPONSES_QUEUE)
        return super()._emulator_queues() + [servicebus_queue(responses, name) for name in BENCH_QUEUES]

    def _emulator_command(self) -> list[str]:
        return [*super()._emulator_command(), "--stats-stdin"]

    # -- what the benchmarks read ------------------------------------------------------------

    @property
    def pids(self) -> dict[str, int | None]:
        """The stack's processes a CPU meter reads, by name (see :func:`process_group`): each live
        host process (``host-H``) and its live worker processes (``worker-H``, ``worker-H.2``...),
        Azurite, the emulator. Read it when the hosts are ready (``start_hosts`` waits for that):
        a worker started later (``FUNCTIONS_WORKER_PROCESS_COUNT`` > 1, 10 s apart by default) or
        restarted after it is not in a meter built before."""
        pids: dict[str, int | None] = {
            "azurite": self.azurite.process.pid if self.azurite else None,
            "servicebus": self.emulator.pid if self.emulator else None,
        }
        for index, (host, log) in enumerate(zip(self.hosts, self.host_logs), 1):
            if host.poll() is None:
                pids[f"host-{index}"] = host.pid
                pids.update(host_workers(index, host.pid, log.read_text(encoding="utf-8", errors="replace")))
        return pids

    def worker_pids(self) -> dict[str, int]:
        """The live worker processes of every live host, by name (``worker-H``...)."""
        return {name: pid for name, pid in self.pids.items() if pid is not None and process_group(name) == WORKERS}

    def stop_host(self, index: int, timeout: float = 30.0) -> None:
        """Stop host ``index`` (1-based) as Azure stops an instance: SIGTERM to the host process
        alone, which drains and then ends its worker processes (WorkerTerminate); its process
        group is killed if it has not exited by ``timeout``. The other hosts keep running."""
        process = self.hosts[index - 1]
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def sb_counts(self) -> dict[str, int]:
        """The Service Bus emulator's operation counters so far (see tools/servicebus_emulator/README.md)."""
        with self._stats_lock:
            self.emulator.stdin.write("stats\n")
            self.emulator.stdin.flush()
            answer = json.loads(self.emulator.stdout.readline())
        return answer["operations"]

    def settings_object(self, **extra: str) -> Settings:
        """The app's Settings for this stack (to build clients exactly as the app does)."""
        values = {**self.env, **extra} if self.remote else {
            names.STORAGE_CONNECTION: self.azurite.connection_string,
            names.SERVICEBUS_CONNECTION: self.servicebus_connection_string,
            **extra,
        }
        return Settings(**values)

    def table(self, name: str = names.ORDERS_TABLE) -> TableClient:
        """A client of one of the stack's tables; all share one service client (one pool)."""
        if self._tables is None:
            self._tables = clients.table_service(self.settings_object())
        return self._tables.get_table_client(name)

    def alive_hosts(self) -> list[subprocess.Popen]:
        return [host for host in self.hosts if host.poll() is None]


class OrderSender:
    """Sends orders like any client: one ServiceBusClient and sender, reused."""

    def __init__(self, connection_string: str) -> None:
        self.client = ServiceBusClient.from_connection_string(connection_string)
        self.sender = self.client.get_queue_sender(names.ORDERS_QUEUE)

    def send(self, order_ids: list[str], start_index: int = 0, workflow: str | None = None) -> dict[str, float]:
        """Send the orders (in batches of up to 100), on ``workflow`` (none: the default);
        returns each order's send time (epoch s)."""
        sent: dict[str, float] = {}
        for first in range(0, len(order_ids), 100):
            chunk = order_ids[first : first + 100]
            batch = [order_message(order_id, start_index + first + n, workflow) for n, order_id in enumerate(chunk)]
            at = time.time()
            self.sender.send_messages(batch)
            sent.update({order_id: at for order_id in chunk})
        return sent

    def close(self) -> None:
        self.sender.close()
        self.client.close()
