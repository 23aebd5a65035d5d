"""Start Azurite (from npm) in memory on free loopback ports, for the host's own tests.

The ``azurite`` command is looked up in ``$AZURITE`` if set, else in the nearest
``node_modules/.bin`` above this file (an ``npm ci`` of the project that holds the
tool), else on ``PATH``. Asked for port 0, Azurite binds free ports and prints them;
they are read from its output.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

#: Azurite's well-known development account (public, the same in every Azurite).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
SERVICES = ("Blob", "Queue", "Table")

_LISTENING = re.compile(r"Azurite (Blob|Queue|Table) service is successfully listening at http://127\.0\.0\.1:(\d+)")


class AzuriteError(RuntimeError):
    """Azurite is not installed or did not start."""


def find_azurite() -> str:
    if os.environ.get("AZURITE"):
        return os.environ["AZURITE"]
    for directory in Path(__file__).resolve().parents:
        candidate = directory / "node_modules" / ".bin" / "azurite"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("azurite")
    if found:
        return found
    raise AzuriteError(
        "no azurite command: run `npm ci` in the project that holds this tool (Azurite from npm), "
        "or set AZURITE to the azurite command"
    )


@dataclass
class Azurite:
    process: subprocess.Popen
    ports: dict[str, int]
    output: list[str]

    @property
    def connection_string(self) -> str:
        endpoints = "".join(
            f"{service}Endpoint=http://127.0.0.1:{self.ports[service]}/{ACCOUNT};" for service in SERVICES
        )
        return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};{endpoints}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def start(timeout: float = 60.0) -> Azurite:
    """Start Azurite (blob, queue and table) in memory on free ports; raise AzuriteError if it can't."""
    command = find_azurite()
    if shutil.which("node") is None:
        raise AzuriteError("Node.js is not on PATH; Azurite needs it")
    args = [command, "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--loose"]
    for service in SERVICES:
        key = service.lower()
        args += [f"--{key}Host", "127.0.0.1", f"--{key}Port", "0"]
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
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
                if len(found) == len(SERVICES):
                    ready.set()
        ready.set()

    threading.Thread(target=pump, name="azurite-output", daemon=True).start()
    ready.wait(timeout)
    azurite = Azurite(process, found, output)
    if len(found) != len(SERVICES):
        azurite.stop()
        raise AzuriteError("Azurite did not start within %.0f s. Its output:\n%s" % (timeout, "\n".join(output)))
    return azurite
