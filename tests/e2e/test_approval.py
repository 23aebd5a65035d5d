"""Approval steps on the whole local stack: orders of the order-approval workflow sent
as a client sends them, run by the real function_app.py on a local host against the
fake remote services; approved over HTTP (the operator's route), rejected by
``ordersctl reject`` (a message on the order-events queue, as any client sends one).
The other cases (timed out, refused, duplicates, the race with the deadline) run on
Azurite in tests/integration/test_order_events.py and on the in-memory table in
tests/unit/test_waiting_steps.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import requests

from core.models import ProcessState
from devtools.orders import order_json
from tests import ROOT
from tests.e2e.conftest import FAST, wait_until


def test_approved_goes_on_to_processed_rejected_ends_compensated_and_nothing_is_applied_twice(stack, tmp_path):
    (host,) = stack.start_hosts(API_AUTH="none")
    stack.send([(o, order_json(o, workflow="order-approval")) for o in ("ap-1", "ap-2")])
    api = f"{host.http_url}/api"

    def waiting(order_id: str):
        document = requests.get(f"{api}/orders/{order_id}", timeout=10).json()
        return document if document.get("waiting") else None

    documents = {o: wait_until(lambda o=o: waiting(o), timeout=60, what=f"{o} waiting") for o in ("ap-1", "ap-2")}
    assert documents["ap-1"]["waiting"]["event"] == "approval" and documents["ap-1"]["step"] == "approve"
    assert [s["state"] for s in documents["ap-1"]["steps"]][:2] == ["Done", "WaitingForEvent"]
    approval = {"approved": True, "by": "alice", "note": "checked"}

    # Approved over HTTP: 202 with the order document, then on to charge and ship.
    accepted = requests.post(f"{api}/orders/ap-1/events/approval", json=approval, timeout=30)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["steps"][1]["result"] == approval
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

    states = stack.wait_closed(["ap-1", "ap-2"], timeout=60)
    assert states["ap-1"].process_state is ProcessState.PROCESSED
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
    # The wait and the event are spans in each order's trace.
    wait_until(lambda: {"order.wait", "order.event"} <= {span["name"] for span in stack.spans("ap-1")},
               timeout=30, what="the wait's and the event's spans")
