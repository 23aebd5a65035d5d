"""A fake of the remote service the agents call: idempotent by key, with injected faults.

A development tool for tests, benchmarks and the demo; production calls the real
service. Start it in-process::

    from devtools.fake_remote import start
    svc = start(port=0, rates={"transient": 0.1}, seed=1)
    ... call f"{svc.url}/fulfil" ...
    svc.effects()   # what was applied, per key and per order
    svc.stop()

or as a process: ``python -m devtools.fake_remote --port 7081 --transient 0.1 --seed 1``.
The contract and the fault kinds are described in ``docs/fake-remote.md``.
"""

from devtools.fake_remote.faults import FAULT_KINDS, FaultConfigError
from devtools.fake_remote.ledger import confirmation_for
from devtools.fake_remote.server import FakeRemote, start

__all__ = ["FAULT_KINDS", "FakeRemote", "FaultConfigError", "confirmation_for", "start"]
