"""What a newcomer and an operator run: the demo (short form) and ordersctl, as processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests import ROOT
from tests.e2e.conftest import wait_until


def stack_processes(mark: str) -> list[int]:
    """Processes (other than zombies) that carry this stack's mark in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"LOCAL_STACK_ID={mark}".encode() in (entry / "environ").read_bytes():
                if (entry / "stat").read_text().split(") ")[1][0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_demo_short_form(tmp_path, report_figure):
    mark = uuid.uuid4().hex
    result = subprocess.run(
        [sys.executable, "-m", "devtools.demo", "--orders", "30", "--invalid", "3", "--out", str(tmp_path), "--time-limit", "180"],
        cwd=ROOT, env={**os.environ, "LOCAL_STACK_ID": mark}, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["not_terminal"] == 0
    assert summary["processed"] + summary["error"] == 30
    assert summary["rejected"] == 3
    assert summary["remote_effects"] == summary["processed"] and summary["effects_equal_processed"]
    assert (tmp_path / "run.png").stat().st_size > 10_000
    assert "Summary" in result.stdout
    assert stack_processes(mark) == []
    report_figure(f"demo (30 orders): {json.dumps({k: summary[k] for k in ('processed', 'error', 'rejected', 'supervisor_resets', 'latency_p50_s', 'latency_p95_s', 'elapsed_s')})}")


def test_ctrl_c_during_the_demo_leaves_no_process_behind(tmp_path):
    mark = uuid.uuid4().hex
    log = open(tmp_path / "demo.log", "w")
    demo = subprocess.Popen(
        [sys.executable, "-m", "devtools.demo", "--orders", "500", "--out", str(tmp_path)],
        cwd=ROOT, env={**os.environ, "LOCAL_STACK_ID": mark}, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: "sending" in (tmp_path / "demo.log").read_text(), timeout=90, what="the demo to start sending")
        assert len(stack_processes(mark)) >= 4  # the demo, Azurite, the emulator, the hosts
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) == 130
        wait_until(lambda: stack_processes(mark) == [], timeout=30, what="every stack process to end")
    finally:
        if demo.poll() is None:
            demo.kill()
        for pid in stack_processes(mark):
            os.kill(pid, signal.SIGKILL)


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ordersctl", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_ordersctl_against_the_local_stack(stack, tmp_path):
    env = {**os.environ, "COLUMNS": "200"}
    stack.remote.set_faults(script={"cli-2": ["permanent"]})
    stack.emulator.declare_queue("cli-replies")
    stack.start_hosts()

    assert cli("send-order", "--order-id", "bad/id", "--customer", "c", "--item", "s:1:1.00", env=env).returncode == 1
    assert cli("list", "--state", "Bogus", env=env).returncode == 2
    assert cli("status", "no-such-order", env=env).returncode == 1

    sent = cli("send-order", "--order-id", "cli-1", "--customer", "c-1", "--item", "sku-1:2:12.50",
               "--reply-to", "cli-replies", env=env)
    assert sent.returncode == 0, sent.stderr
    order_file = tmp_path / "order.json"
    order_file.write_text(json.dumps({"order_id": "cli-2", "customer_id": "c-2", "currency": "EUR",
                                      "items": [{"sku": "s", "quantity": 1, "unit_price": "3.00"}], "total": "3.00"}))
    assert cli("send-order", "--file", str(order_file), env=env).returncode == 0
    states = stack.wait_terminal(["cli-1", "cli-2"], timeout=30)
    assert (states["cli-1"].process_state.value, states["cli-2"].process_state.value) == ("Processed", "Error")

    watched = cli("watch-status", "cli-replies", "--count", "3", "--timeout", "5", env=env)
    assert watched.returncode == 0 and [w for w in ("received", "processing", "processed") if w in watched.stdout] == ["received", "processing", "processed"]
    shown = cli("status", "cli-1", env=env)
    assert shown.returncode == 0 and "Processed" in shown.stdout and "25.00 EUR" in shown.stdout
    listed = cli("list", "--state", "Error", env=env)
    assert listed.returncode == 0 and "cli-2" in listed.stdout
    alerts = cli("alerts", env=env)
    assert alerts.returncode == 0 and "cli-2" in alerts.stdout
    assert cli("dead-letters", stack.settings["ORDERS_QUEUE"], env=env).returncode == 0

    refused = cli("resubmit", "cli-1", env=env)
    assert refused.returncode == 1 and "not Error" in refused.stderr
    resubmitted = cli("resubmit", "cli-2", env=env)  # the remote's refusal was a one-off
    assert resubmitted.returncode == 0, resubmitted.stderr
    wait_until(lambda: stack.state("cli-2").process_state.value == "Processed", timeout=30, what="cli-2 to be processed")
    assert stack.remote.effects()["by_order"] == {"cli-1": 1, "cli-2": 1}
