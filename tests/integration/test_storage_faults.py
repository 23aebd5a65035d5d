"""Azure's ambiguous answers, reproduced by the fault proxy (tools/storage_faults) between
the app and Azurite, with the real SDKs and their retry policies: each case of
docs/scale.md, "Azure's push-back, and what the app does". The same cases over the
in-memory table are in tests/unit/test_ambiguous_writes.py."""

from __future__ import annotations

from datetime import timedelta

import pytest

from adapters import wiring
from adapters.accounts import LAYOUT_PARTITION, LAYOUT_ROW
from adapters.settings import Settings
from adapters.wiring import services
from core import lifecycle
from core.models import AgentRequest, LineState, Nudge, ProcessState, utcnow
from core.workflow import Kind
from devtools.orders import order_json
from tests.integration.test_dispatch_and_supervise import answer, record, schedule
from tests.integration.test_submission import submit as submit_message
from tests.servicebus_helpers import bodies, receive
from supervisor.supervision import resubmit
from tools.storage_faults import proxied, start_in_thread, upstreams_of


@pytest.fixture
def storage_proxy(azurite):
    proxy = start_in_thread(upstreams_of(azurite.connection_string), seed=1)
    yield proxy
    proxy.stop()


@pytest.fixture
def storage_connection_string(azurite, storage_proxy) -> str:
    """The app's storage goes through the proxy (app_settings reads this)."""
    return proxied(azurite.connection_string, storage_proxy.endpoints)


def submit(order_id: str, reply_to: str | None = None) -> Nudge:
    return Nudge.model_validate_json(submit_message(order_json(order_id), message_id=order_id, reply_to=reply_to).value)


def requests_sent(app_settings, servicebus_emulator, remote: str, count: int) -> list[AgentRequest]:
    messages = receive(servicebus_emulator.connection_string, app_settings[f"{remote.upper()}_REQUESTS_QUEUE"], count)
    return [AgentRequest.model_validate_json(str(m)) for m in messages]


@pytest.mark.parametrize("fault", ["500-applied", "reset-applied"])
def test_a_claim_applied_but_reported_failed_still_sends_its_request(app_settings, servicebus_emulator, storage_proxy, fault):
    nudge = submit("o-1")
    # The first claim: the state row's If-Match MERGE and the deletion of its first-claim seal, one transaction.
    storage_proxy.inject(fault, service="table", method="POST")
    request = schedule(nudge)
    assert request is not None, "the app took its own claim for someone else's"
    (sent,) = requests_sent(app_settings, servicebus_emulator, "inventory", 1)
    assert (sent.step, sent.attempt) == ("reserve", 1)
    state = services().store.get("o-1")
    assert (state.process_state, state.attempt) == (ProcessState.PROCESSING, 1)
    assert services().store.recognised == {"write": 1}
    assert storage_proxy.counts()["faults"][fault] == 1


@pytest.mark.parametrize("fault", ["500-applied", "reset-applied"])
def test_a_step_transaction_applied_but_reported_failed_still_starts_the_next_step(
    app_settings, servicebus_emulator, storage_proxy, fault
):
    request = schedule(submit("o-2"))
    requests_sent(app_settings, servicebus_emulator, "inventory", 1)
    storage_proxy.inject(fault, service="table", method="POST")  # the step row + the state row
    assert record(answer(request)) is not None
    (charge,) = requests_sent(app_settings, servicebus_emulator, "payments", 1)
    assert charge.step == "charge"
    lines = services().store.read("o-2").lines
    assert [(line.step, line.kind, line.state) for line in lines] == [("reserve", Kind.ACTION, LineState.DONE)]
    assert services().store.recognised == {"write": 1}


@pytest.mark.parametrize("fault", ["500-applied", "reset-applied"])
def test_a_create_applied_but_reported_failed_is_created_nudged_and_received(
    app_settings, servicebus_emulator, storage_proxy, unique_name, fault
):
    replies = unique_name("replies-")
    servicebus_emulator.declare_queue(replies)
    storage_proxy.inject(fault, service="table", method="POST")  # the order + state rows
    nudge = submit("o-3", reply_to=replies)
    assert nudge.document is not None and nudge.state.process_state is ProcessState.PENDING
    assert [e["status"] for e in bodies(receive(servicebus_emulator.connection_string, replies, 1))] == ["received"]
    assert services().store.recognised == {"create": 1}
    assert schedule(nudge) is not None


def test_an_index_delete_applied_then_retried_meets_404_and_succeeds(app_settings, storage_proxy):
    submit("o-4")
    storage_proxy.inject("500-applied", service="table", method="DELETE")
    services().store.unindex("o-4")
    assert "o-4" not in [row[0] for row in services().store.active_ids()]
    assert storage_proxy.counts()["faults"]["500-applied"] == 1


def test_a_nudge_sent_twice_by_the_queue_sdks_retry_claims_once(app_settings, servicebus_emulator, storage_proxy):
    nudge = submit("o-5")
    storage_proxy.inject("500-applied", service="queue", method="POST")
    services().nudger.nudge(nudge)
    queue = services().nudger.queue_for("o-5")
    copies = [Nudge.model_validate_json(m.content) for m in queue.receive_messages(max_messages=32)]
    assert len(copies) == 2, "the SDK's retry did not send the applied nudge again"
    assert [schedule(copy) is not None for copy in copies] == [True, False]
    assert len(requests_sent(app_settings, servicebus_emulator, "inventory", 2)) == 1


def test_a_rejection_applied_then_retried_is_one_row(app_settings, storage_proxy):
    storage_proxy.inject("500-applied", service="table", method="PUT")
    submit_message(b"{not json", message_id="bad-1")
    (row,) = services().rejections.list()
    assert row["MessageId"] == "bad-1" and row["Body"] == b"{not json"


def test_the_services_start_when_ensuring_a_table_gets_no_answer(app_settings, storage_proxy):
    """ordersctl and every host build the services first; a create-table POST whose
    connection drops is not retried by the SDK, and must not stop them (the operator's
    resubmit failed on it in a push-back soak)."""
    wiring.reset()
    storage_proxy.inject("reset-applied", service="table", method="POST")
    built = services()
    assert storage_proxy.counts()["faults"]["reset-applied"] == 1
    submit("o-7")
    assert built.store.get("o-7").process_state is ProcessState.PENDING


@pytest.mark.parametrize("fault", ["reset", "reset-applied", "500-applied", "503"])
def test_the_services_start_when_the_layout_row_is_written_without_an_answer(app_settings, storage_proxy, fault):
    """The first start writes each account's layout row (adapters/accounts.py): a POST, which
    azure-core sends again after a 5xx but never after a dropped connection. Applied or not,
    the start reads the row again and goes on (the operator's resubmit failed on it in a
    push-back soak: RemoteDisconnected while building the services)."""
    table = services().store.table
    table.delete_entity(LAYOUT_PARTITION, LAYOUT_ROW)  # the next start is a first one
    wiring.reset()
    storage_proxy.inject("pass", service="table", method="POST", times=2)  # the two create-table POSTs go by
    storage_proxy.inject(fault, service="table", method="POST")  # the layout row's create
    built = services()
    assert storage_proxy.counts()["faults"][fault] == 1
    row = table.get_entity(LAYOUT_PARTITION, LAYOUT_ROW)
    assert (row["Position"], row["Accounts"]) == (0, 1)
    submit("o-9")
    assert built.store.get("o-9").process_state is ProcessState.PENDING


#: The storage requests of an operator's resubmit from a process of its own, as ordersctl runs
#: it: the two tables ensured, the account layout read; the order read, its active-index row,
#: the transition, the nudge, its error-group row read and deleted.
RESUBMIT_REQUESTS = 8


@pytest.mark.parametrize("fault", ["reset", "reset-applied"])
@pytest.mark.parametrize("at", range(RESUBMIT_REQUESTS))
def test_an_operators_resubmit_survives_a_dropped_connection_on_any_of_its_requests(
    app_settings, storage_proxy, at, fault
):
    """Each request of ``ordersctl resubmit`` in turn loses its connection, before or after it
    was applied (what azure-core sends again for a GET, PUT or DELETE, never for a POST or a
    PATCH): the services still start and the order is Pending again. Found by this sweep: the
    account layout's create (a push-back soak's resubmit had failed on it)."""
    order_id = f"rs-{at}"
    submit(order_id)
    store = services().store
    record = store.read(order_id)
    store.write_over(record, lifecycle.fail(record.state, "stopped for the test", record.state.updated_at))
    storage_proxy.inject("pass", times=at)  # the requests before it go through
    storage_proxy.inject(fault)
    fresh = wiring.Services.from_settings(Settings())  # a process of its own, as ordersctl's
    written = resubmit(order_id, store=fresh.store, nudger=fresh.nudger, now=utcnow(),
                       pending_timeout=timedelta(seconds=30))
    assert storage_proxy.counts()["faults"][fault] == 1  # it landed on request number at + 1
    assert written.process_state is ProcessState.PENDING and store.get(order_id).etag == written.etag


@pytest.mark.parametrize("fault", ["reset", "reset-applied"])
def test_an_operators_resubmit_survives_a_dropped_connection(app_settings, storage_proxy, fault):
    """ordersctl resubmit: its transition is a PATCH, which azure-core does not send again
    after a dropped connection. Applied or not, the store reads the row: its own write id
    there is the write done; the row as it was means not applied, and it is sent again
    (the operator's resubmit failed on this in a push-back soak, RemoteDisconnected)."""
    submit("o-8")
    store = services().store
    record = store.read("o-8")  # written over as the app writes: its seal goes, the resubmit is a lone PATCH
    store.write_over(record, lifecycle.fail(record.state, "stopped for the test", record.state.updated_at))
    storage_proxy.inject(fault, service="table", method="PATCH")
    written = resubmit("o-8", store=store, nudger=services().nudger, now=utcnow(), pending_timeout=timedelta(seconds=30))
    assert written.process_state is ProcessState.PENDING and store.get("o-8").etag == written.etag
    assert storage_proxy.counts()["faults"][fault] == 1
    assert store.recognised == ({"write": 1} if fault == "reset-applied" else {})

