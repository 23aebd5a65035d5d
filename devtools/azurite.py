"""Start Azurite in memory on free loopback ports and hand back a connection string.

Azurite comes from npm, pinned in ``package.json`` and installed into this repo's
``node_modules`` (``npm ci``), never globally. Asked for port 0, Azurite binds free
ports and prints them; we read them from its output.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from adapters.clients import DEV_ACCOUNT, DEV_KEY, development_storage
from devtools.paths import ROOT

AZURITE_BIN = ROOT / "node_modules" / ".bin" / "azurite"

_LISTENING = re.compile(r"Azurite (Blob|Queue|Table) service is successfully listening at http://127\.0\.0\.1:(\d+)")


class AzuriteError(RuntimeError):
    """Azurite is not installed or did not start."""


@dataclass
class Azurite:
    process: subprocess.Popen
    ports: dict[str, int]
    output: list[str]

    #: Accounts served besides the development account (``start(accounts=...)``).
    accounts: tuple[str, ...] = ()

    @property
    def connection_string(self) -> str:
        return development_storage(self.ports["Blob"], self.ports["Queue"], self.ports["Table"])

    def account_connection_string(self, account: str) -> str:
        """The connection string of one of the other accounts this Azurite serves."""
        if account not in self.accounts:
            raise AzuriteError(f"this Azurite serves no account {account!r} (it serves {', '.join(self.accounts)})")
        return development_storage(self.ports["Blob"], self.ports["Queue"], self.ports["Table"], account=account)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


#: Accounts the local stack's Azurite serves besides the development account: the order
#: state over several accounts (adapters/accounts.py) runs locally on these.
STATE_ACCOUNTS = ("devstatestore1", "devstatestore2", "devstatestore3", "devstatestore4")


def start(ports: dict[str, int] | None = None, timeout: float = 60.0, *, debug_log: Path | None = None,
          accounts: tuple[str, ...] = STATE_ACCOUNTS) -> Azurite:
    """Start Azurite (blob, queue and table) in memory; raise AzuriteError if it can't.

    ``ports`` picks fixed ports (e.g. the well-known 10000-10002); by default every
    service binds a free port. ``debug_log`` makes Azurite write its debug log (one
    ``Operation=...`` line per request, used by the benchmarks to count operations)
    to that file; it slows Azurite down, so it is off by default. ``accounts``: accounts
    served besides the development account, all with its well-known key (Azurite's
    ``AZURITE_ACCOUNTS``, which replaces the default account, so that one is listed too).
    """
    if not AZURITE_BIN.exists():
        raise AzuriteError(
            f"Azurite is not installed at {AZURITE_BIN.relative_to(ROOT)}: run `npm ci` in the "
            "repository root (the README's test and demo commands do it for you)."
        )
    if shutil.which("node") is None:
        raise AzuriteError("Node.js is not on PATH; Azurite needs it (see the README's prerequisites).")
    ports = ports or {"Blob": 0, "Queue": 0, "Table": 0}
    args = [str(AZURITE_BIN), "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--loose"]
    for service, port in ports.items():
        key = service.lower()
        args += [f"--{key}Host", "127.0.0.1", f"--{key}Port", str(port)]
    if debug_log is not None:
        args += ["--debug", str(debug_log)]
    env = dict(os.environ)
    if accounts:
        env["AZURITE_ACCOUNTS"] = ";".join(f"{name}:{DEV_KEY}" for name in (DEV_ACCOUNT, *accounts))
    process = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    found: dict[str, int] = {}
    output: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line.rstrip())
            del output[:-200]
            match = _LISTENING.search(line)
            if match:
                found[match.group(1)] = int(match.group(2))
                if len(found) == 3:
                    ready.set()
        ready.set()

    threading.Thread(target=pump, name="azurite-output", daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.1):
        if time.monotonic() > deadline:
            break
    azurite = Azurite(process, found, output, tuple(accounts))
    if len(found) != 3:
        azurite.stop()
        raise AzuriteError("Azurite did not start within %.0f s. Its output:\n%s" % (timeout, "\n".join(output)))
    return azurite
