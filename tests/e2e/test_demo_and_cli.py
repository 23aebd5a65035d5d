"""What a newcomer and an operator run: the demo (short form) and ordersctl, as processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from adapters.wiring import services
from core.models import utcnow
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
        [sys.executable, "-m", "devtools.demo", "--orders", "30", "--invalid", "3", "--permanent", "0.1",
         "--out", str(tmp_path), "--time-limit", "180"],
        cwd=ROOT, env={**os.environ, "LOCAL_STACK_ID": mark, "COLUMNS": "160"}, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["not_terminal"] == 0
    assert summary["processed"] + summary["compensated"] + summary["error"] == 30
    # All three final states: refusals at payments and shipping are undone, and the
    # three orders scripted to fail (one of each kind) end in Error.
    assert summary["processed"] > 0 and summary["compensated"] > 0 and summary["error"] >= 3
    assert len(summary["scripted_errors"]) == 3 and set(summary["scripted_errors"]) <= set(summary["error_orders"])
    assert summary["rejected"] == 3
    assert summary["alerts"] == summary["error"]
    assert summary["all_passed"] and all(check["passed"] for check in summary["checks"])
    # A quarter of the orders ran reserve and charge at once (order-parallel), checked alike.
    assert summary["by_workflow"]["order-parallel"]["orders"] > 0 and summary["by_workflow"]["order"]["orders"] > 0
    checked = " ".join(check["check"] for check in summary["checks"])
    for words in ("Processed", "Compensated", "Error", "twice", "Complete-By", "alert"):
        assert words in checked, f"no check about {words!r}"
    effects = summary["remote_effects"]
    assert set(effects) == {"inventory", "payments", "shipping"}
    # What stays applied: one action per service for each Processed order, plus what
    # the Error orders left (listed per order for an operator).
    left_by_errors = {service: 0 for service in effects}
    for info in summary["error_orders"].values():
        for what in info["left_applied"]:
            left_by_errors[what.split()[0]] += 1
    for service, figures in effects.items():
        assert figures["left"] == summary["processed"] + left_by_errors[service], (service, figures)
    assert (tmp_path / "run.png").stat().st_size > 10_000
    assert "Summary" in result.stdout and "all checks passed" in result.stdout
    assert stack_processes(mark) == []
    report_figure(f"demo (30 orders): {json.dumps({k: summary[k] for k in ('processed', 'compensated', 'error', 'rejected', 'supervisor_resets', 'latency_p50_s', 'latency_p95_s', 'elapsed_s')})}")


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
    # cli-2: shipping refuses it, so it is undone; the release of its stock is refused
    # once, so it cannot be undone whole: Error, with an alert, until a resubmit.
    stack.remote.set_faults(script={"cli-2/ship": ["permanent"], "cli-2/release": ["permanent"]})
    replies = stack.emulator.declare_queue(f"cli-replies-{uuid.uuid4().hex[:8]}")
    stack.start_hosts()

    assert cli("send-order", "--order-id", "bad/id", "--customer", "c", "--item", "s:1:1.00", env=env).returncode == 1
    assert cli("list", "--state", "Bogus", env=env).returncode == 2
    assert cli("status", "no-such-order", env=env).returncode == 1

    sent = cli("send-order", "--order-id", "cli-1", "--customer", "c-1", "--item", "sku-1:2:12.50",
               "--reply-to", replies, env=env)
    assert sent.returncode == 0, sent.stderr
    order_file = tmp_path / "order.json"
    order_file.write_text(json.dumps({"order_id": "cli-2", "customer_id": "c-2", "currency": "EUR",
                                      "items": [{"sku": "s", "quantity": 1, "unit_price": "3.00"}], "total": "3.00"}))
    assert cli("send-order", "--file", str(order_file), env=env).returncode == 0
    states = stack.wait_closed(["cli-1", "cli-2"], timeout=30)
    assert (states["cli-1"].process_state.value, states["cli-2"].process_state.value) == ("Processed", "Error")

    watched = cli("watch-status", replies, "--count", "5", "--timeout", "5", env=env)
    assert watched.returncode == 0, watched.stderr
    assert [line.split()[2] for line in watched.stdout.splitlines() if line.strip()] == [
        "received", "processing(reserve)", "processing(charge)", "processing(ship)", "processed",
    ]
    shown = cli("status", "cli-1", env=env)
    assert shown.returncode == 0 and "Processed" in shown.stdout and "25.00 EUR" in shown.stdout

    shown = cli("status", "cli-2", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert (document["order_id"], document["state"]) == ("cli-2", "Error")
    assert [(s["step"], s["kind"], s["state"]) for s in document["steps"]] == [
        ("reserve", "action", "Done"), ("charge", "action", "Done"), ("ship", "action", "Refused"),
        ("charge", "compensation", "Done"), ("reserve", "compensation", "Failed"),
    ]
    listed = cli("list", "--state", "Error", env=env)
    assert listed.returncode == 0 and "cli-2" in listed.stdout and "cli-1" not in listed.stdout
    alerts = cli("alerts", env=env)
    assert alerts.returncode == 0 and "cli-2" in alerts.stdout and "reserve" in alerts.stdout
    assert cli("dead-letters", stack.settings["ORDERS_QUEUE"], env=env).returncode == 0
    # A breaker as an agent publishes it on a state change: the operator sees which
    # service is held off on which host.
    services().store.publish_breaker("payments", "host-a", "open", utcnow())
    held = cli("breakers", env=env)
    assert held.returncode == 0 and "host-a" in held.stdout and "not closed on some host: payments" in held.stdout

    refused = cli("resubmit", "cli-1", env=env)
    assert refused.returncode == 1 and "not Error" in refused.stderr
    resubmitted = cli("resubmit", "cli-2", env=env)  # the refusal of the release was a one-off
    assert resubmitted.returncode == 0, resubmitted.stderr
    wait_until(lambda: stack.state("cli-2").process_state.value == "Compensated", timeout=30, what="cli-2 to be undone")
    assert {key: line.state.value for key, line in stack.lines("cli-2").items()}[("reserve", "compensation")] == "Done"
    listed = cli("list", "--state", "Compensated", env=env)
    assert listed.returncode == 0 and "cli-2" in listed.stdout
    assert stack.applied("shipping") == {"cli-1": ["ship"]}
    assert stack.undone("payments") == {"cli-2": ["refund"]} and stack.undone("inventory") == {"cli-2": ["release"]}
    assert stack.remote.net("cli-2") == {"inventory": {"reserve": 0}, "payments": {"charge": 0}}
    stack.assert_remote_clean()
