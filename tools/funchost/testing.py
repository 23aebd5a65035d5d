"""Drive local host processes (``python -m tools.funchost``) in tests or scripts.

:class:`FuncHosts` launches one or more host processes for an app directory with extra
app settings (connection strings, queue names...), waits until each logs its readiness
line, and returns :class:`HostProcess` handles that can be stopped (SIGTERM, draining),
interrupted (SIGINT) or killed (SIGKILL, for crash tests). Each process writes its log
to a file. It needs no test framework; a pytest fixture is three lines::

    @pytest.fixture
    def funchost(request, tmp_path_factory):
        hosts = FuncHosts(tmp_path_factory.mktemp("funchost-logs"), app_dir=APP_DIR)
        yield hosts
        hosts.stop_all()
        if hosts.hosts:
            request.node.add_report_section("teardown", "funchost logs", hosts.logs())

    def test_flow(funchost, storage_connection_string, servicebus_connection_string):
        hosts = funchost.start(count=2, env={
            "AzureWebJobsStorage": storage_connection_string,
            "ServiceBusConnection": servicebus_connection_string,
        })
        ...
        hosts[0].kill()
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .host import INSTANCE_ID_SETTING, READY_MARKER, STOPPED_MARKER

#: The name to run the host with (``python -m <MODULE>``), and where that name imports from.
MODULE = __package__
IMPORT_ROOT = Path(__file__).resolve().parents[MODULE.count(".") + 1]

_READY = re.compile(
    re.escape(READY_MARKER)
    + r" functions=(\d+) errors=(\d+) instance=(\S+)(?: sync_threads=(\d+))?(?: http=(http://\S+))?"
)
_EXECUTED = re.compile(r"Executed 'Functions\.([^']+)' \((Succeeded|Failed), Id=([^,]+), Duration=(\d+)ms\)(.*)")
_WORKER_READY = re.compile(r"\[funchost\] worker (\d+): ready \(process (\d+)\)")


class HostError(AssertionError):
    """A host process did not start, or stopped in a way the test did not ask for."""


@dataclass
class Invocation:
    function: str
    outcome: str
    invocation_id: str
    duration_ms: int
    details: str

    @property
    def succeeded(self) -> bool:
        return self.outcome == "Succeeded"


@dataclass
class HostProcess:
    """One running host process and its log file."""

    name: str
    process: subprocess.Popen
    log_path: Path
    env: dict[str, str] = field(repr=False)
    instance_id: str = ""
    functions: int = 0
    errors: int = 0
    #: The size of the worker's shared thread pool for sync functions (from the readiness line).
    sync_threads: int = 0
    #: The HTTP functions' base URL, ``http://127.0.0.1:PORT`` (from the readiness line); "" when the app has none.
    http_url: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 80) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_ready(self, timeout: float = 60.0, *, allow_errors: bool = False) -> HostProcess:
        """Wait for the readiness line; fail with the log if the process exits or the time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            match = _READY.search(self.log_text())
            if match:
                self.functions, self.errors, self.instance_id = int(match[1]), int(match[2]), match[3]
                self.sync_threads = int(match[4] or 0)
                self.http_url = match[5] or ""
                if self.errors and not allow_errors:
                    raise HostError(f"{self.name}: {self.errors} function(s) in error:\n{self.log_tail()}")
                return self
            if not self.running:
                raise HostError(
                    f"{self.name} exited with code {self.returncode} before it was ready:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise HostError(f"{self.name} was not ready after {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def wait_for_log(self, pattern: str, timeout: float = 30.0) -> re.Match:
        """Wait until a line matching ``pattern`` (a regex) appears in the log."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.log_text())
            if match:
                return match
            if time.monotonic() > deadline:
                raise HostError(
                    f"{self.name}: no log line matching {pattern!r} after {timeout:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def invocations(self, function: str | None = None) -> list[Invocation]:
        """The invocations this host logged (one ``Executed 'Functions.x' (...)`` line each)."""
        found = []
        for line in self.log_text().splitlines():
            match = _EXECUTED.search(line)
            if match and (function is None or match[1] == function):
                found.append(Invocation(match[1], match[2], match[3], int(match[4]), match[5].strip()))
        return found

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the worker processes that became ready, in order (a restarted one is a new id)."""
        return [int(match[2]) for match in _WORKER_READY.finditer(self.log_text())]

    def send_signal(self, signum: int) -> None:
        if self.running:
            self.process.send_signal(signum)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait: the host drains in-flight messages and exits. Returns the exit code."""
        self.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise HostError(f"{self.name} did not stop within {timeout:.0f} s of SIGTERM:\n{self.log_tail()}")

    stop = terminate

    def interrupt(self) -> None:
        """SIGINT, as Ctrl-C in a terminal (does not wait)."""
        self.send_signal(signal.SIGINT)

    def kill(self) -> int:
        """SIGKILL: a crash, nothing is drained or settled."""
        if self.running:
            self.process.kill()
        return self.process.wait(30)

    @property
    def stopped_cleanly(self) -> bool:
        return STOPPED_MARKER in self.log_text()


class FuncHosts:
    """Starts host processes and keeps track of them; ``stop_all()`` ends every one still running.

    ``app_dir`` is the default app directory of :meth:`start`.
    """

    def __init__(self, log_dir: Path | str, *, app_dir: Path | str | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.app_dir = Path(app_dir) if app_dir is not None else None
        self.hosts: list[HostProcess] = []

    def start(
        self,
        app_dir: Path | str | None = None,
        *,
        count: int = 1,
        env: Mapping[str, str] | None = None,
        settings: Path | str | None = None,
        functions: Iterable[str] | None = None,
        drain_timeout: float | None = None,
        wait: bool = True,
        ready_timeout: float = 60.0,
        allow_errors: bool = False,
        args: Iterable[str] = (),
        http_port: int | None = 0,
    ) -> list[HostProcess]:
        """Start ``count`` host processes for ``app_dir``; by default wait until all are ready.

        ``env`` adds or overrides app settings (environment variables win over
        local.settings.json). Each process gets its own ``WEBSITE_INSTANCE_ID`` unless
        ``env`` sets one. ``settings`` picks a local settings file (default: the app
        directory's local.settings.json, if any). ``http_port`` is the port of an app's
        HTTP functions: 0 (the default) a free one per process, read back as
        :attr:`HostProcess.http_url`; None lets the host choose as on the command line.
        """
        app_dir = app_dir if app_dir is not None else self.app_dir
        if app_dir is None:
            raise ValueError("no app directory: pass app_dir to start() or to FuncHosts()")
        started = [
            self._launch(Path(app_dir), env or {}, settings, functions, drain_timeout, args, http_port)
            for _ in range(count)
        ]
        if wait:
            for host in started:
                host.wait_ready(ready_timeout, allow_errors=allow_errors)
        return started

    def _launch(self, app_dir, env, settings, functions, drain_timeout, args, http_port) -> HostProcess:
        name = f"funchost-{len(self.hosts) + 1}"
        log_path = self.log_dir / f"{name}.log"
        child_env = dict(os.environ)
        child_env.pop(INSTANCE_ID_SETTING, None)
        child_env["PYTHONUNBUFFERED"] = "1"
        child_env.update({key: str(value) for key, value in env.items()})
        command = [sys.executable, "-m", MODULE, "--app-dir", str(app_dir)]
        if settings is not None:
            command += ["--settings", str(settings)]
        if functions:
            command += ["--functions", *functions]
        if drain_timeout is not None:
            command += ["--drain-timeout", str(drain_timeout)]
        if http_port is not None:
            command += ["--port", str(http_port)]
        command += list(args)
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                command,
                cwd=IMPORT_ROOT,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        host = HostProcess(name, process, log_path, child_env)
        self.hosts.append(host)
        return host

    def stop_all(self, timeout: float = 30.0) -> None:
        for host in self.hosts:
            host.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for host in self.hosts:
            try:
                host.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                host.kill()

    def logs(self) -> str:
        return "\n".join(f"===== {host.name} (pid {host.pid}) =====\n{host.log_tail(200)}" for host in self.hosts)
