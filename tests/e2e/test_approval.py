"""Approval steps on the whole local stack: orders of the order-approval workflow sent
as a client sends them, run by the real function_app.py on a local host against the
fake remote services; approved on the operator page in a browser (its approve button
posts to the operator's route), rejected by
``ordersctl reject`` (a message on the order-events queue, as any client sends one), or
cancelled while it waits (the cancel undoes the step before at once: nothing is in flight).
Timed out (the deadline set by APPROVAL_TIMEOUT_SECONDS) is tests/e2e/test_approval_timeout.py's.
The other cases (refused, sent twice, the race with the deadline) run on Azurite in
tests/integration/test_order_events.py and on the in-memory table in
tests/unit/test_waiting_steps.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import requests
from selenium.webdriver.common.by import By

from core.models import ProcessState
from devtools.orders import order_json
from tests import ROOT
from tests.e2e.conftest import FAST, wait_until
from tests.e2e.test_operator_page import Page, browser  # noqa: F401 - the browser fixture


def test_approved_goes_on_to_processed_rejected_or_cancelled_while_waiting_ends_compensated_and_nothing_is_applied_twice(
    stack, tmp_path, browser  # noqa: F811 - the fixture imported above
):
    (host,) = stack.start_hosts(API_AUTH="none")
    stack.send([(o, order_json(o, workflow="order-approval")) for o in ("ap-1", "ap-2", "ap-3")])
    api = f"{host.http_url}/api"

    def waiting(order_id: str):
        document = requests.get(f"{api}/orders/{order_id}", timeout=10).json()
        return document if document.get("waiting") else None

    documents = {
        o: wait_until(lambda o=o: waiting(o), timeout=60, what=f"{o} waiting") for o in ("ap-1", "ap-2", "ap-3")
    }
    assert documents["ap-1"]["waiting"]["event"] == "approval" and documents["ap-1"]["step"] == "approve"
    assert [s["state"] for s in documents["ap-1"]["steps"]][:2] == ["Done", "WaitingForEvent"]
    # The page's caller has no name with API_AUTH=none: it signs the event "operator".
    approval = {"approved": True, "by": "operator", "note": "checked"}

    # Approved on the operator page (its approve button posts the event), then on to charge and ship.
    page = Page(browser, tmp_path)
    browser.get(f"{api}/ops")
    page.open_timeline("ap-1")
    page.until(lambda: "waits for approval" in browser.find_element(By.ID, "waiting-text").text
               and browser.find_element(By.ID, "approve").is_displayed(), "ap-1's approve button")
    browser.find_element(By.ID, "waiting-note").send_keys(approval["note"])
    page.click(lambda: browser.find_element(By.ID, "approve"), "approve")
    page.until(lambda: browser.find_element(By.ID, "timeline-waiting").get_attribute("hidden") is not None,
               "the waiting step gone from the page")
    page.screenshot("approved")
    # Rejected by ordersctl, as an order-events message.
    settings = tmp_path / "stack.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": {**FAST, **stack.settings}}))
    env = {key: value for key, value in os.environ.items() if key not in stack.settings}
    sent = subprocess.run(
        [sys.executable, "-m", "ordersctl", "reject", "ap-2", "--by", "bob", "--note", "over budget",
         "--settings", str(settings)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert sent.returncode == 0, sent.stderr
    # Cancelled while it waits: no deadline to wait for, the reservation released at once.
    cancelled = requests.post(f"{api}/orders/ap-3/cancel", json={"reason": "customer called"}, timeout=30)
    assert cancelled.status_code == 202 and cancelled.json()["cancel"]["reason"] == "customer called"

    states = stack.wait_closed(["ap-1", "ap-2", "ap-3"], timeout=60)
    assert states["ap-1"].process_state is ProcessState.PROCESSED
    (approved,) = [line for line in stack.record("ap-1").lines if line.step == "approve"]
    assert approved.result == approval
    assert states["ap-2"].process_state is ProcessState.COMPENSATED
    assert states["ap-2"].cause == "step approve: approval rejected by bob: over budget"
    # Sent twice: a no-op (202, the order as it is); to an order that no longer waits: 409.
    again = requests.post(f"{api}/orders/ap-1/events/approval", json=approval, timeout=30)
    assert again.status_code == 202 and again.json()["state"] == "Processed"
    late = requests.post(f"{api}/orders/ap-2/events/approval", json=approval, timeout=30)
    assert late.status_code == 409 and late.json()["error"] == "conflict"
    assert stack.state("ap-2").process_state is ProcessState.COMPENSATED
    stack.assert_remote_clean()
    # At the remotes: ap-1 reserved, charged and shipped once; ap-2 reserved then released once.
    assert stack.applied("inventory").get("ap-1") == ["reserve"]
    assert stack.applied("payments").get("ap-1") == ["charge"]
    assert "ap-2" not in stack.applied("payments")
    assert stack.undone("inventory").get("ap-2") == ["release"]
    assert states["ap-3"].process_state is ProcessState.COMPENSATED and "customer called" in states["ap-3"].cause
    assert stack.undone("inventory").get("ap-3") == ["release"] and "ap-3" not in stack.applied("payments")
    # The approval that comes after the cancel finds no line waiting: 409, nothing changes.
    after = requests.post(f"{api}/orders/ap-3/events/approval", json=approval, timeout=30)
    assert after.status_code == 409 and stack.state("ap-3").process_state is ProcessState.COMPENSATED
    # The wait and the event are spans in each order's trace.
    wait_until(lambda: {"order.wait", "order.event"} <= {span["name"] for span in stack.spans("ap-1")},
               timeout=30, what="the wait's and the event's spans")
