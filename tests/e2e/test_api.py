"""The status API on the whole local stack: orders sent as a client sends them, run to
their end by the real function_app.py on a local host, then read, listed and resubmitted
over HTTP on that host's URL; and ``make run`` (devtools.run) printing the API's URL and the
operator page's (tests/e2e/test_operator_page.py drives the page in a browser).
The API's refusals, one by one, are in tests/integration/test_api.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid

import requests

from core.models import ProcessState
from devtools.orders import order_json
from tests import ROOT
from tests.e2e.conftest import FAST, wait_until
from tests.e2e.test_demo_and_cli import stack_processes


def ordersctl_status(stack, tmp_path, order_id: str) -> dict:
    """``ordersctl status ORDER --json`` as an operator runs it, with a settings file only."""
    settings = tmp_path / "stack.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": {**FAST, **stack.settings}}))
    env = {key: value for key, value in os.environ.items() if key not in stack.settings}
    shown = subprocess.run(
        [sys.executable, "-m", "ordersctl", "status", order_id, "--json", "--settings", str(settings)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def test_read_list_and_resubmit_orders_over_http(stack, tmp_path):
    # h-2: shipping refuses, so the charge is refunded and the reservation released; but
    # inventory refuses the release: the order stops in Error, its reservation applied.
    stack.remote.set_faults(script={"h-2/ship": ["permanent"], "h-2/release": ["permanent"]})
    (host,) = stack.start_hosts(API_AUTH="none")
    stack.send([("h-1", order_json("h-1")), ("h-2", order_json("h-2"))])
    states = stack.wait_closed(["h-1", "h-2"], timeout=60)
    assert states["h-1"].process_state is ProcessState.PROCESSED
    assert states["h-2"].process_state is ProcessState.ERROR
    api = f"{host.http_url}/api"

    # One order, as `ordersctl status --json` shows it.
    for order_id in ("h-1", "h-2"):
        response = requests.get(f"{api}/orders/{order_id}", timeout=10)
        assert response.status_code == 200, response.text
        assert response.json() == ordersctl_status(stack, tmp_path, order_id)
    document = requests.get(f"{api}/orders/h-1", timeout=10).json()
    assert [(s["step"], s["state"]) for s in document["steps"]] == [
        ("reserve", "Done"), ("charge", "Done"), ("ship", "Done"),
    ]
    # Orders by state.
    processed = requests.get(f"{api}/orders", params={"state": "Processed"}, timeout=10).json()
    assert [o["order_id"] for o in processed["orders"]] == ["h-1"] and processed["continuation"] is None
    in_error = requests.get(f"{api}/orders", params={"state": "Error", "limit": 10}, timeout=10).json()
    assert [(o["order_id"], o["state"]) for o in in_error["orders"]] == [("h-2", "Error")]

    # Only an order in Error can be resubmitted.
    refused = requests.post(f"{api}/orders/h-1/resubmit", timeout=10)
    assert refused.status_code == 409 and "Processed" in refused.json()["reason"]
    # The operator fixes the cause (inventory takes the release now) and resubmits: only
    # the failed undo runs again, and the order ends Compensated.
    stack.remote.set_faults(service="inventory", script=None)
    resubmitted = requests.post(f"{api}/orders/h-2/resubmit", timeout=10)
    assert resubmitted.status_code == 202, resubmitted.text
    assert resubmitted.json()["state"] == "Pending"
    assert stack.wait_closed(["h-2"], timeout=30)["h-2"].process_state is ProcessState.COMPENSATED
    steps = {(s["step"], s["kind"]): s["state"] for s in requests.get(f"{api}/orders/h-2", timeout=10).json()["steps"]}
    assert steps[("reserve", "compensation")] == "Done" and steps[("charge", "compensation")] == "Done"
    assert requests.get(f"{api}/orders", params={"state": "Error"}, timeout=10).json()["orders"] == []
    stack.assert_remote_clean()


def test_make_run_prints_the_api_url_and_serves_it(tmp_path):
    """``make run`` (devtools.run) on free ports: its banner names the status API's URL,
    which answers; Ctrl-C (here SIGINT) stops the whole stack, leaving no process behind."""
    mark = uuid.uuid4().hex
    command = [
        sys.executable, "-m", "devtools.run", "--servicebus-port", "0", "--remote-port", "0", "--api-port", "0",
        "--no-standard-storage-ports", "--settings-out", str(tmp_path / "run.settings.json"),
        "--log-dir", str(tmp_path / "logs"),
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, "COLUMNS": "300", "LOCAL_STACK_ID": mark},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)
    reader.start()
    try:
        banner = wait_until(
            lambda: "Ctrl-C stops everything" in "".join(output) and "".join(output), timeout=120,
            what="make run's banner",
        )
        match = re.search(r"Status API\s*: (http://127\.0\.0\.1:\d+/api)/orders/\{id\}", banner)
        assert match, banner
        api = match[1]
        assert f"curl {api}/orders/o-1" in banner
        assert re.search(rf"Operator page: {re.escape(api)}/ops ", banner), banner
        page = requests.get(f"{api}/ops", timeout=10)
        assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html"), page.text[:300]
        assert 'src="/api/ops/static/ops.js"' in page.text
        listed = requests.get(f"{api}/orders", params={"state": "Error"}, timeout=10)
        assert listed.status_code == 200 and listed.json() == {"state": "Error", "orders": [], "continuation": None}
        assert requests.get(f"{api}/orders/o-1", timeout=10).status_code == 404
    finally:
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(60) == 0, "".join(output)[-3000:]
    reader.join(10)
    assert "stopped." in "".join(output)
    wait_until(lambda: not stack_processes(mark), timeout=30, what="every process of the stack to end")
