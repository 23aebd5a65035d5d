"""Starting and stopping: in-process and as a command."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests

from devtools.fake_remote import start
from tests import ROOT
from tests.fake_remote.client import call, reserve, wait_until


@pytest.mark.parametrize("fault", ["slow", "hang"])
def test_stop_returns_promptly_while_a_delayed_call_is_in_flight(fault):
    svc = start(port=0, script={"o-1": [fault]}, slow_seconds=30)
    outcome = {}

    def call() -> None:
        try:
            outcome["response"] = reserve(svc.url, "o-1", "k", timeout=60)
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
    client = threading.Thread(target=lambda: _swallow(lambda: reserve(svc.url, "o-1", "k", timeout=60)), daemon=True)
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
        assert reserve(svc.url, "o-1", "k", session=session).status_code == 200  # leaves an idle keep-alive connection
        svc.stop()
        with pytest.raises(requests.ConnectionError):
            reserve(svc.url, "o-2", "k-2", session=session, timeout=2)
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
         "--script", '{"o-1": ["transient"]}',
         "--service-faults", '{"payments": {"script": {"o-1/charge": ["throttle"]}, "retry_after_seconds": 3}}'],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        url = _read_line(process.stdout, timeout=10).strip()
        assert url.startswith("http://127.0.0.1:")
        assert reserve(url, "o-1", "key-abc").status_code == 503
        assert reserve(url, "o-1", "key-abc").status_code == 200
        throttled = call(url, "o-1", "key-charge", service="payments", action="charge")
        assert (throttled.status_code, throttled.headers["Retry-After"]) == (429, "3")
        assert call(url, "o-1", "key-ship", service="shipping", action="ship").status_code == 503  # its own copy
        effects = requests.get(f"{url}/_control/effects", timeout=5).json()
        assert effects["total"] == 1

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()

    call_lines = [line for line in stderr.splitlines() if "inventory/reserve order=o-1" in line]
    assert len(call_lines) == 2, stderr
    assert "key=key-abc" in call_lines[0] and "transient" in call_lines[0]
    assert "applied" in call_lines[1] and "status=200" in call_lines[1]
    assert f"serving payments at {url}/payments" in stderr
    assert "stopped inventory: calls=2 applied=1" in stderr
    assert "Traceback" not in stderr


def test_command_serves_the_services_it_is_given():
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools.fake_remote", "--port", "0", "--log-level", "WARNING",
         "--services", '{"billing": {"invoice": "void"}}'],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        url = _read_line(process.stdout, timeout=10).strip()
        health = requests.get(f"{url}/_control/health", timeout=5).json()
        assert health["services"] == {"billing": {"invoice": "void"}}
        assert call(url, "o-1", "k", service="billing", action="invoice").status_code == 200
        assert reserve(url, "o-1", "k").status_code == 404
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()


@pytest.mark.parametrize(
    ("arguments", "mentions"),
    [
        (["--transient", "1.5"], "transient"),
        (["--services", '{"inventory": {}}'], "inventory"),
        (["--service-faults", '{"billing": {}}'], "billing"),
        (["--script", '{"o-1/nope": ["transient"]}'], "nope"),
    ],
)
def test_command_rejects_bad_settings(arguments, mentions):
    result = subprocess.run(
        [sys.executable, "-m", "devtools.fake_remote", "--port", "0", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2
    assert mentions in result.stderr
    assert "Traceback" not in result.stderr


def _read_line(stream, timeout: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, "the command printed no URL"
    return stream.readline()


def _swallow(call) -> None:
    try:
        call()
    except requests.RequestException:
        pass

