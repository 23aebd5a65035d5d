"""Retention on the local stack: orders run to their end, the retention timer archives them
to the archive container and deletes them; a host that dies between the archive and the
deletes (RETENTION_FAULT ends its process there) loses nothing and archives nothing twice;
the API and ``ordersctl archive show`` read the archived orders back."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import requests

from adapters.wiring import services
from core import names, retention
from core.models import ProcessState
from devtools.orders import order_json
from tests import ROOT
from tests.e2e.conftest import FAST
from tests.polling import wait_until

#: Retention due at once (RETENTION_DAYS=0: every order that ended before now), every second.
RETAIN_NOW = {names.RETENTION_DAYS_SETTING: "0", names.RETENTION_SCHEDULE_SETTING: "*/1 * * * * *"}


def archived(day: str) -> list[dict]:
    return [line.document for line in services().archive().lines(day)]


def test_retention_archives_finished_orders_once_across_a_crash_and_reads_them_back(stack):
    ids = ["ret-1", "ret-2", "ret-3"]
    stack.remote.set_faults(script={"ret-3/ship": ["permanent"]})  # refused: undone, Compensated
    (host,) = stack.start_hosts(API_AUTH="none")  # RETENTION_DAYS 30 (the default): nothing due
    stack.send([(order_id, order_json(order_id)) for order_id in ids])
    states = stack.wait_closed(ids, timeout=60)
    assert [states[i].process_state for i in ids] == [ProcessState.PROCESSED] * 2 + [ProcessState.COMPENSATED]
    api = f"{host.http_url}/api"
    shown = {order_id: requests.get(f"{api}/orders/{order_id}", timeout=10).json() for order_id in ids}
    days = {order_id: retention.day_of(states[order_id].updated_at) for order_id in ids}

    # A host whose retention dies right after its archive step, before any delete: its worker process exits
    # there, as a crashed one would. The host starts a new worker (a worker error, not the third), whose
    # next tick finds the batch archived (its block committed): it only deletes, and archives nothing twice.
    fault = {names.RETENTION_FAULT_SETTING: names.RETENTION_FAULT_EXIT}
    (crashing,) = stack.funchost.start(env={**FAST, **RETAIN_NOW, **fault}, wait=False)
    stack.hosts.append(crashing)
    crashing.wait_for_log(r"worker 0 exited with code 70", timeout=60)
    wait_until(lambda: all(stack.state(order_id) is None for order_id in ids), timeout=60,
               what="the restarted worker's retention to delete the finished orders")
    # (The tick logs what it did once it is done: after the deletes this test waited for.)
    ticks = wait_until(lambda: re.findall(r"retention tick: (\{.*\})", crashing.log_text()), timeout=30,
                       what="the retention tick's log line")
    assert sum(ast.literal_eval(t).get("already_archived", 0) for t in ticks) == len(ids), ticks
    assert crashing.running and crashing.log_text().count("Language Worker Process exited") == 1
    lines = [doc for day in set(days.values()) for doc in archived(day)]
    assert sorted(doc["order_id"] for doc in lines) == ids
    for doc in lines:  # as the API showed it before it was deleted, with the time it was archived
        assert {k: v for k, v in doc.items() if k != "archived_at"} == shown[doc["order_id"]]
    assert requests.get(f"{api}/orders/ret-1", timeout=10).status_code == 404

    # Read back: the API...
    day = days["ret-1"]
    listed = requests.get(f"{api}/archive/{day}", timeout=10)
    assert listed.status_code == 200, listed.text
    assert "ret-1" in [o["order_id"] for o in listed.json()["orders"]]
    one = requests.get(f"{api}/archive/{day}/orders/ret-1", timeout=10)
    assert one.status_code == 200 and one.json()["order_id"] == "ret-1" and one.json()["state"] == "Processed"
    assert requests.get(f"{api}/archive/{day}/orders/nope", timeout=10).status_code == 404
    assert requests.get(f"{api}/archive/2026-02-30", timeout=10).status_code == 400
    # ...and ordersctl.
    env = {**os.environ, "COLUMNS": "200"}
    cli = subprocess.run([sys.executable, "-m", "ordersctl", "archive", "show", day, "--order", "ret-1"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["order"]["order_id"] == "ret-1"
    missing = subprocess.run([sys.executable, "-m", "ordersctl", "archive", "show", "2000-01-01"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no archive for 2000-01-01" in missing.stderr
