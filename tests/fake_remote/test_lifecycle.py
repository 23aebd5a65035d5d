"""Starting and stopping: in-process and as a command."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from devtools.fake_remote import start
from tests.fake_remote.client import fulfil, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fault", ["slow", "hang"])
def test_stop_returns_promptly_while_a_delayed_call_is_in_flight(fault):
    svc = start(port=0, script={"o-1": [fault]}, slow_seconds=30)
    outcome = {}

    def call() -> None:
        try:
            outcome["response"] = fulfil(svc.url, "o-1", "k", timeout=60)
        except requests.RequestException as error:
            outcome["error"] = error

    client = threading.Thread(target=call, daemon=True)
    client.start()
    wait_until(lambda: svc.effects()["faults"][fault] == 1, what=f"the {fault} call to start")

    started = time.monotonic()
    svc.stop()
    assert time.monotonic() - started < 2

    client.join(timeout=5)
    assert not client.is_alive()
    assert isinstance(outcome.get("error"), requests.ConnectionError)  # no response from a stopped service


def test_stop_interrupts_a_long_apply():
    svc = start(port=0, apply_seconds=30)
    client = threading.Thread(target=lambda: _swallow(lambda: fulfil(svc.url, "o-1", "k", timeout=60)), daemon=True)
    client.start()
    wait_until(lambda: svc.effects()["in_flight"] == 1, what="the call to start applying")
    started = time.monotonic()
    svc.stop()
    assert time.monotonic() - started < 2
    client.join(timeout=5)
    assert not client.is_alive()
    assert svc.effects()["total"] == 0


def test_a_stopped_service_serves_nothing_not_even_kept_alive_connections():
    svc = start(port=0)
    with requests.Session() as session:
        assert fulfil(svc.url, "o-1", "k", session=session).status_code == 200  # leaves an idle keep-alive connection
        svc.stop()
        with pytest.raises(requests.ConnectionError):
            fulfil(svc.url, "o-2", "k-2", session=session, timeout=2)
    svc.stop()  # idempotent


def test_context_manager_stops():
    with start(port=0) as svc:
        url = svc.url
        assert requests.get(f"{url}/_control/health", timeout=5).ok
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/_control/health", timeout=2)


def test_command_prints_url_logs_each_call_and_stops_on_sigterm():
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools.fake_remote", "--port", "0", "--transient", "0.0", "--seed", "1",
         "--script", '{"o-1": ["transient"]}'],  # fmt: skip
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = _read_line(process.stdout, timeout=10).strip()
        assert url.startswith("http://127.0.0.1:")
        assert fulfil(url, "o-1", "key-abc").status_code == 503
        assert fulfil(url, "o-1", "key-abc").status_code == 200
        assert requests.get(f"{url}/_control/effects", timeout=5).json()["total"] == 1

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()

    call_lines = [line for line in stderr.splitlines() if "order=o-1" in line]
    assert len(call_lines) == 2, stderr
    assert "key=key-abc" in call_lines[0] and "transient" in call_lines[0]
    assert "applied" in call_lines[1] and "status=200" in call_lines[1]
    assert "Traceback" not in stderr


def test_command_rejects_bad_rates():
    result = subprocess.run(
        [sys.executable, "-m", "devtools.fake_remote", "--port", "0", "--transient", "1.5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2
    assert "transient" in result.stderr


def _read_line(stream, timeout: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, "the command printed no URL"
    return stream.readline()


def _swallow(call) -> None:
    try:
        call()
    except requests.RequestException:
        pass

