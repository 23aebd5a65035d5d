"""A fake of the remote services the agents call: several services on one HTTP server,
each with actions and compensations, idempotent by key, with injected faults.

A development tool for tests, benchmarks and the demo; production calls the real
services. Start it in-process::

    from devtools.fake_remote import start
    svc = start(port=0, rates={"transient": 0.1}, seed=1)   # inventory, payments, shipping
    svc.base_url("inventory")       # f"{svc.url}/inventory": POST {base}/reserve, {base}/release
    svc.set_faults(script={"o-1/release": ["transient"]}, service="inventory")
    svc.effects()                   # what was applied and undone, per service and per order
    svc.stop()

or as a process: ``python -m devtools.fake_remote --port 7081 --transient 0.1 --seed 1``.
The contract, the fault kinds and the control API are described in ``docs/fake-remote.md``.
"""

from devtools.fake_remote.catalog import DEFAULT_SERVICES
from devtools.fake_remote.faults import FAULT_KINDS, FaultConfigError
from devtools.fake_remote.ledger import LATE_TOLERANCE_SECONDS, confirmation_for
from devtools.fake_remote.server import FakeRemote, start
from devtools.fake_remote.watch import Watch, WatchedCall

__all__ = [
    "DEFAULT_SERVICES",
    "FAULT_KINDS",
    "LATE_TOLERANCE_SECONDS",
    "FakeRemote",
    "FaultConfigError",
    "Watch",
    "WatchedCall",
    "confirmation_for",
    "start",
]
