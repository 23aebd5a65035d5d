"""Orders through the whole local stack while Service Bus pushes back as Azure does:
the namespace throttled, locks lost, links and connections dropped (the emulator's
injected faults, tools/servicebus_emulator/faults.py). Nothing may be lost, nothing
applied twice at a remote, and every order must end in a final state."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from core import names
from core.models import ProcessState
from devtools.localstack import app_queues, servicebus_queue
from devtools.orders import order_json
from devtools.stats import audit_effects
from tools import servicebus_emulator as emulator
from tools.servicebus_emulator import Faults

#: A namespace's credits per second far below what 24 orders ask for in a burst (each order
#: costs about 14: 7 messages sent, 7 received), and every other fault at a rate that hits
#: each kind several times in the run.
FAULTS = Faults(throttle=40, lock_lost=0.03, link_drop=0.01, connection_drop=0.005, seed=20)
#: The test's queues' lock duration: a message delivered on a link that drops stays locked
#: until its lock expires (60 s for the app's queues in Azure); the hosts renew locks at half-life.
LOCK_SECONDS = 4.0
ORDERS = 24


@pytest.fixture(scope="module")
def servicebus_emulator():
    """An emulator of this module's own (faults are namespace-wide), with the app's queues."""
    try:
        instance = emulator.start(queues=app_queues())
    except Exception as error:  # noqa: BLE001 - any reason it cannot run fails the run
        pytest.fail(f"The Service Bus emulator could not start: {error}", pytrace=False)
    yield instance
    instance.stop()


def test_orders_survive_throttling_lost_locks_and_dropped_links(stack, report_figure):
    for spec in names.SERVICEBUS_QUEUES:
        queue = stack.settings[spec.setting]
        stack.emulator.declare_queue(replace(servicebus_queue(spec, queue), lock_duration=LOCK_SECONDS))
    stack.emulator.set_faults(FAULTS)
    try:
        # Step deadlines well above what the SDK's retries of a throttled send can take (1 + 2 + 4 s).
        stack.start_hosts(2, STEP_TIMEOUT_SECONDS="12", PENDING_TIMEOUT_SECONDS="12")
        ids = [f"sbf-{i:03d}" for i in range(ORDERS)]
        for start in range(0, ORDERS, 10):  # a credit a message: in batches, as a client shares a namespace
            stack.send([(order_id, order_json(order_id)) for order_id in ids[start : start + 10]])
        states = stack.wait_closed(ids, timeout=55)
        faults = stack.emulator.fault_counts()
    finally:
        stack.emulator.set_faults(Faults())
    effects = stack.remote.effects()
    finals = Counter(state.process_state.value for state in states.values())
    report_figure(f"Service Bus faults ({FAULTS.to_arg()}): {ORDERS} orders {dict(finals)}, faults injected {faults}")

    assert all(state.process_state.terminal for state in states.values()), finals
    audit = audit_effects(states.values(), effects)
    assert audit.ok, audit.failures()  # each final state matches the remotes' ledger
    stack.assert_remote_clean()  # nothing applied twice, no call after its complete-by
    assert finals[ProcessState.ERROR.value] == 0 and not stack.all_alerts()
    assert finals[ProcessState.PROCESSED.value] >= ORDERS * 0.9, finals
    for spec in names.SERVICEBUS_QUEUES:
        assert stack.emulator.message_counts(stack.settings[spec.setting])["dead_letter"] == 0, spec.name
    # Every kind of fault happened, some several times.
    assert faults["throttled"] > 0 and faults["lock_lost"] > 0, faults
    assert faults["link_drop"] > 0 and faults["connection_drop"] > 0, faults
