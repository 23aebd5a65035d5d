"""Conformance with the official JavaScript SDK, ``@azure/service-bus`` 7.x, run by Node.

``js/conformance.mjs`` (next to this file) drives the SDK through sending (a batch, single
messages with every property), peek-lock and complete, abandon up to dead-lettering,
abandon with properties to modify, dead-letter, defer and receive-deferred, schedule and
cancel, peek, lock renewal, session receivers refused at once, and receive-and-delete, each
on its own queue, and prints one JSON result per check. The SDK is a devDependency of the
project's ``package.json`` (``npm ci`` installs it). A missing Node or SDK fails the run: it
is never skipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import IMPORT_ROOT

SCRIPT = Path(__file__).parent / "js" / "conformance.mjs"
TIMEOUT = 300  # seconds; a run takes about 10 s, a check that hangs gives up after 45 s
INSTALL_HINT = "run `npm ci` in the directory that holds package.json (it installs @azure/service-bus)"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"Node.js is not installed, so the JavaScript SDK cannot run: install Node 18+ and {INSTALL_HINT}")
    return node


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [_node(), str(SCRIPT), *args],
            cwd=IMPORT_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        output = error.stdout.decode(errors="replace") if isinstance(error.stdout, bytes) else error.stdout
        pytest.fail(f"{SCRIPT.name} {args[0]} did not finish within {timeout} s; output so far:\n{output}")


def _plan() -> dict[str, Any]:
    listed = _run("--list")
    if listed.returncode != 0:
        if "ERR_MODULE_NOT_FOUND" in listed.stderr or "Cannot find" in listed.stderr:
            pytest.fail(f"The JavaScript SDK @azure/service-bus is not installed: {INSTALL_HINT}.\n{listed.stderr}")
        pytest.fail(f"{SCRIPT.name} --list failed (exit {listed.returncode}):\n{listed.stderr}")
    return json.loads(listed.stdout)


def test_the_javascript_sdk_passes_every_conformance_check(servicebus_emulator, unique_name, report_figure):
    plan = _plan()
    assert plan["sdk"].startswith("@azure/service-bus@7."), plan["sdk"]
    prefix = unique_name("js") + "-"
    for entry in plan["checks"]:
        servicebus_emulator.declare_queue(prefix + entry["check"], **entry["queue"])

    run = _run(
        "--connection-string", servicebus_emulator.connection_string, "--queue-prefix", prefix, timeout=TIMEOUT
    )

    results = []
    for line in run.stdout.splitlines():
        try:
            results.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # not a result (the SDK does not print, but be lenient)
    failures = [f"{r['check']}: {r.get('error', '?')}" for r in results if not r.get("ok")]
    assert not failures, f"{plan['sdk']} failed {len(failures)} check(s):\n" + "\n\n".join(failures)
    assert [r["check"] for r in results] == [entry["check"] for entry in plan["checks"]], run.stdout + run.stderr
    assert run.returncode == 0, f"exit {run.returncode}:\n{run.stderr}"
    for entry in plan["checks"]:
        counts = servicebus_emulator.message_counts(prefix + entry["check"])
        assert counts == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}, (entry["check"], counts)
    report_figure(f"JavaScript SDK {plan['sdk']}: {len(results)} conformance checks passed")
