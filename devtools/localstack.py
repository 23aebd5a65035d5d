"""The whole local stack in one object: Azurite, the Service Bus emulator, the fake
remote service and local Functions host processes running ``function_app.py``.

Used by ``make demo`` (devtools.demo), ``make run`` (devtools.run) and the benchmarks.
Every process it starts is stopped by :meth:`LocalStack.stop`, also after Ctrl-C.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from core import names
from core.workflow import remotes
from devtools import azurite as azurite_launcher
from devtools import fake_remote
from devtools.paths import ROOT
from tools.servicebus_emulator import Faults, QueueSettings
from tools.storage_faults import CONTROL_PATH, StorageFaults
from tools.storage_faults import KINDS as STORAGE_FAULT_KINDS

STACK_MARK = "LOCAL_STACK_ID"
_READY = re.compile(r"funchost ready: functions=(\d+) errors=(\d+)(?:.*? http=(http://\S+))?")


class StackError(RuntimeError):
    """A part of the local stack did not start."""


def app_names() -> dict[str, str]:
    """The queue/table/schedule app settings with their default names."""
    return dict(names.NAME_SETTINGS)


def servicebus_queue(spec: names.ServiceBusQueueSpec, name: str | None = None) -> QueueSettings:
    """One of the app's Service Bus queues as the emulator declares it (under ``name`` if given)."""
    return QueueSettings(
        name=name or spec.name,
        lock_duration=spec.lock_duration.total_seconds(),
        max_delivery_count=spec.max_delivery_count,
        default_ttl=spec.default_ttl.total_seconds(),
        dead_letter_on_expiry=spec.dead_letter_on_expiry,
        duplicate_detection=spec.duplicate_detection,
        duplicate_detection_window=spec.duplicate_detection_window.total_seconds(),
    )


def app_queues() -> list[QueueSettings]:
    """The app's Service Bus queues (``core.names.SERVICEBUS_QUEUES``), for the emulator."""
    return [servicebus_queue(spec) for spec in names.SERVICEBUS_QUEUES]


#: The default throttle: Azure Standard's 1,000 credits per second per namespace scaled to
#: what this machine's local stack carries. Azure's limit stops the three-step order near
#: 71 orders/s (14 credits: 7 messages sent, 7 received); the soak runs ~6.4 orders/s on 2
#: cores and spends ~100-120 credits/s with its duplicates, replays and peeks. 250 is about
#: twice that: its bursts are throttled, as a Standard namespace run at a third of its limit
#: is in its bursts. At 100 (below the soak's demand) the soak measured a collapse: see
#: docs/scale.md, "Throughput with throttling against without".
DEFAULT_THROTTLE_CREDITS = 250.0


@dataclass(frozen=True)
class ServiceBusFaults(Faults):
    """Azure's Service Bus push-back for the local stack's emulator (``--servicebus-faults SPEC``):
    credits per second per namespace (``throttle``), and the probabilities of a lost lock (per
    delivery) and of a dropped link or connection (per frame on a queue's link); see
    tools/servicebus_emulator/faults.py and docs/scale.md."""

    @classmethod
    def default(cls) -> ServiceBusFaults:
        """Moderate rates: a throttle that bites at the soak's load, 1% locks lost, 0.5% links and
        0.2% connections dropped."""
        return cls(throttle=DEFAULT_THROTTLE_CREDITS, lock_lost=0.01, link_drop=0.005, connection_drop=0.002)

    @classmethod
    def from_option(cls, text: str) -> ServiceBusFaults:
        """A ``--servicebus-faults`` value: ``default`` (:meth:`default`), ``none``, or a spec such as
        ``throttle=1000,lock-lost=0.01,link-drop=0.005,connection-drop=0.002,seed=7``. Raises ValueError."""
        return cls.default() if text.strip().lower() == "default" else cls.parse(text)


#: The help of the ``--servicebus-faults`` option (devtools.run, benchmarks.soak).
SERVICEBUS_FAULTS_HELP = (
    "Azure's Service Bus push-back, injected by the emulator: 'default' (throttle="
    f"{DEFAULT_THROTTLE_CREDITS:g} credits/s, lock-lost=0.01, link-drop=0.005, connection-drop=0.002), 'none', or "
    "throttle=CREDITS_PER_SECOND,lock-lost=P,link-drop=P,connection-drop=P[,seed=N] (docs/scale.md)."
)


#: The help of the ``--storage-faults`` option (devtools.run, benchmarks.soak).
STORAGE_FAULTS_HELP = (
    f"Put Azure Storage's push-back between the app and Azurite's tables and queues (tools/storage_faults): "
    f"KIND=RATE per request, KIND one of {', '.join(STORAGE_FAULT_KINDS)} (latency=RATE:SECONDS), "
    "e.g. 503=0.02,500-applied=0.01,reset-applied=0.01,latency=0.05:0.5."
)


def _fault_option(text: str | None, parse, message):
    """A fault option's value parsed for a command line (None when not given); a bad one
    is the command line's error (``message(error)``)."""
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError as error:
        import typer

        raise typer.BadParameter(message(error)) from None


def servicebus_faults_option(text: str | None) -> ServiceBusFaults | None:
    """Parse a ``--servicebus-faults`` value for a command line (None when not given)."""
    return _fault_option(text, ServiceBusFaults.from_option, lambda error: f"--servicebus-faults {text!r}: {error}")


def storage_faults_option(text: str | None) -> StorageFaults | None:
    """``--storage-faults``: the fault proxy's rates, or None (no proxy)."""
    return _fault_option(text, StorageFaults.parse, str)


@dataclass
class LocalStack:
    #: App settings for the hosts on top of the connections and names (tuning values).
    settings: dict[str, str] = field(default_factory=dict)
    #: Fault rates of the fake remote service, e.g. {"transient": 0.1}.
    remote_rates: dict[str, float] = field(default_factory=dict)
    remote_seed: int = 1
    remote_slow_seconds: float = 30.0
    #: Fixed ports for people who connect from elsewhere (``make run``); 0 = free ports.
    servicebus_port: int = 0
    remote_port: int = 0
    #: The first host's HTTP port (the status API, api/): ``make run`` takes 7071, as
    #: Core Tools does; 0 = a free port. Further hosts take free ports.
    http_port: int = 0
    storage_ports: dict[str, int] | None = None
    #: Remote services served elsewhere: remote name -> base URL (the fake one serves the rest).
    remote_urls: dict[str, str] = field(default_factory=dict)
    #: Queues for clients beside the app's (a submitter's ReplyTo queue, e.g. ``my-status``).
    client_queues: tuple[str, ...] = ()
    log_dir: Path = ROOT / "demo-output" / "logs"
    #: Azure Storage's push-back (tools/storage_faults): when set, the hosts reach Azurite's
    #: tables and queues through the fault proxy at these rates (``--storage-faults``).
    storage_faults: StorageFaults | None = None
    storage_faults_seed: int = 1
    #: Azure's Service Bus push-back injected by the emulator (None: none).
    servicebus_faults: ServiceBusFaults | None = None
    #: Accounts of Azurite the order state is spread over (1: the development account, as
    #: before; more: ``devtools.azurite.STATE_ACCOUNTS``' first ones, in STATE_STORAGE_ACCOUNTS).
    state_accounts: int = 1
    #: Each host writes its spans and metric points as JSON lines beside its log
    #: (``spans-host-N.jsonl``, ``metrics-host-N.jsonl``; docs/observability.md).
    telemetry: bool = True

    def __post_init__(self) -> None:
        self.azurite = None
        self.storage_proxy: subprocess.Popen | None = None
        #: The storage connection string the app uses: Azurite's, or through the fault proxy.
        self.storage_connection_string = ""
        self.emulator: subprocess.Popen | None = None
        self._emulator_stats_lock = threading.Lock()
        self.servicebus_connection_string = ""
        self.remote = None
        self.hosts: list[subprocess.Popen] = []
        self.host_logs: list[Path] = []
        #: Each host's HTTP base URL (``http://127.0.0.1:PORT``), in start order.
        self.http_urls: list[str] = []
        #: The hosts' telemetry files (when ``telemetry``): spans, and metric points.
        self.spans_files: list[Path] = []
        self.metrics_files: list[Path] = []

    # -- starting -----------------------------------------------------------------------

    def start(self, hosts: int = 1) -> LocalStack:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Every process of this stack inherits a mark, so a check (or a person) can find
        # any that outlived it: grep the mark in /proc/*/environ.
        os.environ.setdefault(STACK_MARK, uuid.uuid4().hex)
        try:
            self.azurite = self._start_azurite()
            self._provision_storage()
            self._start_storage_proxy()
            self._start_emulator()
            self.remote = self._start_remote()
            self.start_hosts(hosts)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_azurite(self):
        return azurite_launcher.start(self.storage_ports)

    def _start_remote(self):
        if all(remote in self.remote_urls for remote in remotes()):
            return None  # every remote service is served elsewhere
        return fake_remote.start(
            port=self.remote_port, rates=self.remote_rates or None, seed=self.remote_seed,
            slow_seconds=self.remote_slow_seconds,
        )

    def remote_url(self, remote: str) -> str:
        """The base URL the agents use for a remote service: the one given, else the fake
        remote's, which serves every remote service at ``{url}/{service}``."""
        return self.remote_urls.get(remote) or f"{self.remote.url}/{remote}"

    def _provision_storage(self) -> None:
        """Create the tables and storage queues, as the Bicep does in Azure."""
        from azure.data.tables import TableServiceClient
        from azure.storage.queue import QueueServiceClient

        tables = TableServiceClient.from_connection_string(self.azurite.connection_string)
        for name, _ in names.TABLES:
            tables.create_table_if_not_exists(name)
        queues = QueueServiceClient.from_connection_string(self.azurite.connection_string)
        for name, _ in names.STORAGE_QUEUES:
            for queue in (name, name + names.POISON_SUFFIX):
                queues.create_queue(queue)

    def _start_storage_proxy(self) -> None:
        """The fault proxy in front of Azurite's tables and queues, if faults are asked for."""
        self.storage_connection_string = self.azurite.connection_string
        if self.storage_faults is None:
            return
        log = open(self.log_dir / "storage-faults.log", "wb")  # noqa: SIM115 - the proxy writes to it until it stops
        self.storage_proxy = subprocess.Popen(
            [sys.executable, "-m", "tools.storage_faults", "--connection-string", self.azurite.connection_string,
             "--faults", self.storage_faults.to_arg(), "--seed", str(self.storage_faults_seed)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, text=True,
        )
        line = self.storage_proxy.stdout.readline().strip()
        if "TableEndpoint=" not in line:
            raise StackError(f"the storage fault proxy did not start (see {log.name})")
        self.storage_connection_string = line

    def _storage_proxy_control(self, method: str = "GET", body: dict | None = None) -> dict:
        endpoint = next(p.split("=", 1)[1] for p in self.storage_connection_string.split(";")
                        if p.startswith("TableEndpoint="))
        request = urllib.request.Request(
            endpoint.rsplit("/", 1)[0] + CONTROL_PATH, method=method, data=json.dumps(body).encode() if body else None
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)

    def storage_fault_counts(self) -> dict:
        """The faults the proxy injected by kind, and the requests it served per service (empty without it)."""
        if self.storage_proxy is None:
            return {}
        return self._storage_proxy_control()

    def set_storage_faults(self, faults: StorageFaults) -> None:
        """Change the proxy's rates (e.g. none, for an operator's phase)."""
        if self.storage_proxy is not None:
            self._storage_proxy_control("PUT", {"faults": faults.to_arg()})

    #: What the emulator process reads on stdin (the benchmarks ask it for operation counts there).
    emulator_stdin = subprocess.DEVNULL

    def _emulator_queues(self) -> list[QueueSettings]:
        return [*app_queues(), *(QueueSettings(name) for name in self.client_queues)]

    def _emulator_command(self) -> list[str]:
        queues = [arg for queue in self._emulator_queues() for arg in ("--queue", queue.to_arg())]
        faults = ["--faults", self.servicebus_faults.to_arg(), "--stats-stdin"] if self._faulty else []
        return [sys.executable, "-m", "tools.servicebus_emulator", "--port", str(self.servicebus_port),
                "--log-level", "WARNING", *queues, *faults]

    @property
    def _faulty(self) -> bool:
        return self.servicebus_faults is not None and self.servicebus_faults.enabled

    def _start_emulator(self) -> None:
        log = open(self.log_dir / "servicebus-emulator.log", "wb")  # noqa: SIM115 - the emulator writes to it until it stops
        self.emulator = subprocess.Popen(
            self._emulator_command(), cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
            stdin=subprocess.PIPE if self._faulty else self.emulator_stdin,  # faults: it answers "stats" there
            start_new_session=True, text=True,
        )
        line = self.emulator.stdout.readline().strip()
        if not line.startswith("Endpoint="):
            raise StackError(f"the Service Bus emulator did not start (see {log.name})")
        self.servicebus_connection_string = line

    def servicebus_fault_counts(self) -> dict[str, int]:
        """The faults the emulator injected so far, by kind (``throttled``, ``lock_lost``,
        ``link_drop``, ``connection_drop``); empty when it injects none."""
        if not self._faulty or self.emulator is None:
            return {}
        with self._emulator_stats_lock:
            self.emulator.stdin.write("stats\n")
            self.emulator.stdin.flush()
            return json.loads(self.emulator.stdout.readline())["faults"]

    @property
    def env(self) -> dict[str, str]:
        """App settings for a host process (what local.settings.json would hold)."""
        return {
            **app_names(),
            names.STORAGE_CONNECTION: self.storage_connection_string,
            names.SERVICEBUS_CONNECTION: self.servicebus_connection_string,
            **{names.remote_url_setting(remote): self.remote_url(remote) for remote in remotes()},
            names.WORKER_THREADS_SETTING: str(names.WORKER_THREADS),
            # The status API without auth: the hosts listen on loopback only (core/access.py).
            names.API_AUTH_SETTING: "none",
            **self._state_accounts(),
            **self.settings,
        }

    def _state_accounts(self) -> dict[str, str]:
        """STATE_STORAGE_ACCOUNTS for ``state_accounts`` > 1: connection strings of Azurite's
        extra accounts (the hosts create the orders table in each on first use)."""
        if self.state_accounts <= 1:
            return {}
        accounts = azurite_launcher.STATE_ACCOUNTS[: self.state_accounts]
        if len(accounts) < self.state_accounts:
            raise StackError(f"the local stack has {len(azurite_launcher.STATE_ACCOUNTS)} state accounts at most")
        value = ",".join(self.azurite.account_connection_string(account) for account in accounts)
        return {names.STATE_STORAGE_ACCOUNTS_SETTING: value}

    def start_hosts(self, count: int, timeout: float = 60.0) -> None:
        started = []
        for _ in range(count):
            index = len(self.hosts) + 1
            path = self.log_dir / f"host-{index}.log"
            env = {**os.environ, **self.env, **self._telemetry_files(index), "PYTHONUNBUFFERED": "1"}
            env.pop("WEBSITE_INSTANCE_ID", None)
            with open(path, "wb") as log:
                port = self.http_port if index == 1 else 0
                process = subprocess.Popen(
                    [sys.executable, "-m", "tools.funchost", "--app-dir", str(ROOT), "--port", str(port)],
                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            self.hosts.append(process)
            self.host_logs.append(path)
            started.append((process, path))
        deadline = time.monotonic() + timeout
        for process, path in started:
            while True:
                match = _READY.search(path.read_text(errors="replace"))
                if match:
                    if int(match[2]):
                        raise StackError(f"a host has functions in error; see {path}")
                    if match[3]:
                        self.http_urls.append(match[3])
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise StackError(f"a host did not start; see {path}")
                time.sleep(0.1)

    @property
    def api_url(self) -> str:
        """The status API's base URL on the first host, e.g. ``http://127.0.0.1:7071/api``."""
        return f"{self.http_urls[0]}/api" if self.http_urls else ""

    def _telemetry_files(self, index: int) -> dict[str, str]:
        """One spans file and one metrics file per host process, started empty (as its log is)."""
        if not self.telemetry:
            return {}
        spans, points = self.log_dir / f"spans-host-{index}.jsonl", self.log_dir / f"metrics-host-{index}.jsonl"
        for path in (spans, points):
            path.unlink(missing_ok=True)
        self.spans_files.append(spans)
        self.metrics_files.append(points)
        # The operator page reads every host's spans for an order's timeline (api/ops.py).
        every_host = str(Path(glob.escape(str(self.log_dir))) / "spans-host-*.jsonl")
        return {names.SPANS_FILE_SETTING: str(spans), names.METRICS_FILE_SETTING: str(points),
                names.TRACE_SPANS_FILES_SETTING: every_host}

    # -- stopping -----------------------------------------------------------------------

    def stop_hosts(self, timeout: float = 30.0) -> None:
        """Stop every host (SIGTERM: they drain; SIGKILL at the deadline)."""
        for process in self.hosts:
            _signal(process, signal.SIGTERM)
        for process in self.hosts:
            _wait(process, timeout)

    def kill_host(self, process: subprocess.Popen) -> None:
        """SIGKILL a host process (a crash: nothing finishes, nothing is settled)."""
        _signal(process, signal.SIGKILL)
        process.wait(10)

    def stop(self) -> None:
        self.stop_hosts()
        if self.remote is not None:
            self.remote.stop()
        if self.emulator is not None:
            _signal(self.emulator, signal.SIGTERM)
            _wait(self.emulator, 10)
        if self.storage_proxy is not None:
            _signal(self.storage_proxy, signal.SIGTERM)
            _wait(self.storage_proxy, 10)
        if self.azurite is not None:
            self.azurite.stop()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _signal(process: subprocess.Popen, signum: int) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            pass


def _wait(process: subprocess.Popen, timeout: float) -> None:
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        _signal(process, signal.SIGKILL)
        process.wait(10)
