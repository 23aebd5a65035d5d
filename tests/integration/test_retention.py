"""Retention on Azurite: the finished index (tables) walked, the archive written to real
block blobs, the orders deleted; crashes between the steps; the archive read back by the
API's functions and ``ordersctl archive show``'s."""

from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest
from azure.storage.blob import ContainerClient

from adapters import finished, search
from adapters.archive import Archive
from adapters.clients import transport
from adapters import retention as retention_adapter
from adapters.retention import RetentionPolicy, tick
from adapters.store import OrderNotFound, StateStore
from api import archive as archive_api
from benchmarks.sweep import finished_order
from core import lifecycle, retention
from core.models import OrderRequest, ProcessState, utcnow
from core.search import customer_key_range
from core.progress import status_document
from devtools.orders import order_json
from ordersctl.archive import NotArchived, show

NOW = utcnow()
DAYS_AGO_3 = NOW - timedelta(days=3)


@pytest.fixture
def archive(storage_connection_string, unique_name):
    container = ContainerClient.from_connection_string(
        storage_connection_string, unique_name("archive"), transport=transport()
    )
    yield Archive(container)
    if container.exists():
        container.delete_container()


def end(store: StateStore, order_id: str, at, state: ProcessState = ProcessState.PROCESSED):
    """An order that ended at ``at`` in ``state``, with its rows as the app leaves them, and
    indexed as closing it indexes it (adapters/finished.py)."""
    order = OrderRequest.model_validate_json(order_json(order_id))
    ended, lines = finished_order(order_id, at)
    ended = ended.model_copy(update={"process_state": state})
    store.import_order(order, ended, lines)
    written = store.get(order_id)
    finished.record_finished(written, store=store)
    return written


def rows_of(store: StateStore, order_id: str) -> list:
    return list(store.table.query_entities("PartitionKey eq @pk", parameters={"pk": order_id}))


def archived(archive: Archive, day: str) -> list[dict]:
    return [line.document for line in archive.lines(day)]


def policy(**changes) -> RetentionPolicy:
    return RetentionPolicy(**{"days": 1, "include_error": False, "max_orders": 100, **changes})


def test_finished_orders_are_archived_as_the_api_shows_them_then_deleted(store, archive):
    ended = [end(store, f"r-{n}", DAYS_AGO_3 + timedelta(seconds=n)) for n in range(5)]
    ended.append(end(store, "r-comp", DAYS_AGO_3, ProcessState.COMPENSATED))
    expected = {s.order_id: status_document(*_record(store, s.order_id)) for s in ended}

    report = tick(store=store, archive=archive, policy=policy(), now=NOW)
    assert (report["archived"], report["deleted"]) == (6, 6)
    day = retention.day_of(DAYS_AGO_3)
    assert report.blobs == {f"orders/{day}.jsonl"}
    lines = archived(archive, day)
    assert sorted(doc["order_id"] for doc in lines) == sorted(expected)
    for doc in lines:  # each line is the order as GET /api/orders/{id} showed it, with archived_at
        assert {k: v for k, v in doc.items() if k != "archived_at"} == expected[doc["order_id"]]
    # The blob is readable without the app: JSON lines, one order each.
    raw = archive.container.get_blob_client(f"orders/{day}.jsonl").download_blob().readall().decode()
    assert [json.loads(text)["order_id"] for text in raw.splitlines()] == [doc["order_id"] for doc in lines]
    for state in ended:  # every row of the order is gone, and its index row
        assert rows_of(store, state.order_id) == []
    assert finished.due_rows(store, NOW, 0, limit=100) == []
    # Nothing more to do.
    assert tick(store=store, archive=archive, policy=policy(), now=NOW).counts == {}


def _record(store, order_id):
    record = store.read(order_id)
    return record.state, record.document, record.lines


def test_days_not_due_are_untouched(store, archive):
    end(store, "old", DAYS_AGO_3)
    recent = [end(store, f"new-{n}", NOW - timedelta(hours=n)) for n in range(3)]
    report = tick(store=store, archive=archive, policy=policy(days=1), now=NOW)
    assert report["archived"] == 1
    for state in recent:
        assert store.get(state.order_id).process_state is ProcessState.PROCESSED
    assert sorted(r.order_id for r in finished.due_rows(store, NOW + timedelta(days=2), 1, limit=10)) == [
        "new-0", "new-1", "new-2",
    ]
    assert not archive.has_day(retention.day_of(NOW))


def test_error_orders_stay_unless_the_setting_says_so(store, archive):
    end(store, "e-1", DAYS_AGO_3, ProcessState.ERROR)
    report = tick(store=store, archive=archive, policy=policy(), now=NOW)
    assert (report["keep"], report["archived"]) == (1, 0)
    assert store.get("e-1").process_state is ProcessState.ERROR  # kept for an operator
    end(store, "e-2", DAYS_AGO_3 + timedelta(seconds=1), ProcessState.ERROR)
    report = tick(store=store, archive=archive, policy=policy(include_error=True), now=NOW)
    assert report["archived"] == 1
    with pytest.raises(OrderNotFound):
        store.get("e-2")
    assert [doc["state"] for doc in archived(archive, retention.day_of(DAYS_AGO_3))] == ["Error"]


class Crash(Exception):
    pass


def crash():
    raise Crash("the process died after the archive step")


def test_a_crash_between_archive_and_delete_loses_nothing_and_archives_nothing_twice(store, archive):
    ids = [end(store, f"c-{n}", DAYS_AGO_3 + timedelta(seconds=n)).order_id for n in range(4)]
    day = retention.day_of(DAYS_AGO_3)
    with pytest.raises(Crash):
        tick(store=store, archive=archive, policy=policy(), now=NOW, after_archive=crash)
    # Archived, nothing deleted yet.
    assert sorted(doc["order_id"] for doc in archived(archive, day)) == ids
    assert all(store.get(order_id).process_state is ProcessState.PROCESSED for order_id in ids)
    # One more order ended that day meanwhile; the next tick deletes the archived ones and archives that one.
    ids.append(end(store, "c-late", DAYS_AGO_3 + timedelta(seconds=30)).order_id)
    report = tick(store=store, archive=archive, policy=policy(), now=NOW)
    assert (report["already_archived"], report["archived"], report["deleted"]) == (4, 1, 5)
    lines = archived(archive, day)
    assert sorted(doc["order_id"] for doc in lines) == sorted(ids)  # each once
    assert len(archive.day(day).parts[0].blocks) == 2
    for order_id in ids:
        assert rows_of(store, order_id) == []


class StagingFails(Archive):
    """The real archive, but the process dies at the first append (after the rows were
    marked, before the block was committed)."""

    def __init__(self, container) -> None:
        super().__init__(container)
        self.failures = 1

    def append(self, day, block_id, data):
        if self.failures:
            self.failures -= 1
            raise Crash("died before the commit")
        return super().append(day, block_id, data)


def test_a_crash_before_the_commit_takes_the_marked_rows_into_a_new_batch(store, archive):
    ids = [end(store, f"m-{n}", DAYS_AGO_3 + timedelta(seconds=n)).order_id for n in range(3)]
    failing = StagingFails(archive.container)
    with pytest.raises(Crash):
        tick(store=store, archive=failing, policy=policy(), now=NOW)
    marks = {row.batch for row in finished.due_rows(store, NOW, 1, limit=10)}
    assert len(marks) == 1 and None not in marks  # marked, never committed
    # While the tick that marked them could still be running (another host's), they are its.
    soon = tick(store=store, archive=failing, policy=policy(), now=NOW + timedelta(minutes=1))
    assert (soon["being_archived"], soon["archived"], soon["deleted"]) == (3, 0, 0)
    later = NOW + retention_adapter.MARK_LEASE + timedelta(seconds=1)  # it died: taken over
    report = tick(store=store, archive=failing, policy=policy(), now=later)
    assert (report["already_archived"], report["archived"], report["deleted"]) == (0, 3, 3)
    assert sorted(doc["order_id"] for doc in archived(archive, retention.day_of(DAYS_AGO_3))) == ids


def test_two_ticks_at_once_archive_each_order_once(store, archive):
    """Two hosts' timers tick together (each local host process runs its timers): the
    second reads the rows the first has marked but not committed yet; it leaves them to the
    first, and each order is archived once."""
    ids = [end(store, f"tw-{n}", DAYS_AGO_3 + timedelta(seconds=n)).order_id for n in range(3)]
    reports = []

    def the_other_tick():  # while the first has marked and committed its block, before its deletes
        reports.append(tick(store=store, archive=archive, policy=policy(), now=NOW))

    marked_not_committed = []
    original = finished.mark

    def mark_then_the_other_tick(s, rows, batch, now=None):
        marked = original(s, rows, batch, *([] if now is None else [now]))
        if not marked_not_committed:
            marked_not_committed.append(True)
            the_other_tick()  # it reads the marks; the block is not committed yet
        return marked

    finished.mark = mark_then_the_other_tick
    try:
        first = tick(store=store, archive=archive, policy=policy(), now=NOW)
    finally:
        finished.mark = original
    assert reports[0]["being_archived"] == 3 and reports[0]["archived"] == 0
    assert first["archived"] == first["deleted"] == 3
    assert sorted(doc["order_id"] for doc in archived(archive, retention.day_of(DAYS_AGO_3))) == ids


def test_a_resubmitted_order_is_not_archived_while_in_flight_again(store, archive):
    error = end(store, "rs-1", DAYS_AGO_3, ProcessState.ERROR)
    resubmitted = store.transition(error, lifecycle.resubmit(error, NOW - timedelta(minutes=1), timedelta(seconds=30)))
    assert resubmitted is not None and resubmitted.process_state is ProcessState.PENDING
    report = tick(store=store, archive=archive, policy=policy(include_error=True), now=NOW)
    assert (report["stale"], report["archived"]) == (1, 0)
    assert store.get("rs-1").process_state is ProcessState.PENDING  # untouched
    assert finished.due_rows(store, NOW, 0, limit=10) == []  # its old index row is gone
    assert not archive.has_day(retention.day_of(DAYS_AGO_3))


def test_an_order_resubmitted_between_archive_and_delete_is_kept(store, archive):
    error = end(store, "rs-2", DAYS_AGO_3, ProcessState.ERROR)
    with pytest.raises(Crash):
        tick(store=store, archive=archive, policy=policy(include_error=True), now=NOW, after_archive=crash)
    store.transition(error, lifecycle.resubmit(error, NOW, timedelta(seconds=30)))
    report = tick(store=store, archive=archive, policy=policy(include_error=True), now=NOW)
    assert report["deleted"] == 0
    assert store.get("rs-2").process_state is ProcessState.PENDING
    assert finished.due_rows(store, NOW, 0, limit=10) == []


def test_an_order_resubmitted_while_its_delete_is_under_way_keeps_its_customer_row(store, archive):
    """The resubmit lands after the tick read the order and archived it, before the If-Match
    delete: the order is kept, and so is its row in its customer's index (the tick removes
    the index rows before the order's, so it puts that one back)."""
    error = end(store, "rs-3", DAYS_AGO_3, ProcessState.ERROR)
    order = store.get_order("rs-3")
    search.index_customer(store, order, error.created_at)

    def customers_orders() -> list[str]:
        page = search.by_customer(store, order.customer_id, key_range=customer_key_range(None, None), limit=10)
        return [state.order_id for state in page.orders]

    assert customers_orders() == ["rs-3"]
    report = tick(
        store=store, archive=archive, policy=policy(include_error=True), now=NOW,
        after_archive=lambda: store.transition(store.get("rs-3"), lifecycle.resubmit(error, NOW, timedelta(seconds=30))),
    )
    assert (report["archived"], report["deleted"], report["moved"]) == (1, 0, 1)
    assert store.get("rs-3").process_state is ProcessState.PENDING
    assert customers_orders() == ["rs-3"]


def test_each_tick_does_bounded_work_whatever_waits(store, archive):
    for n in range(25):
        end(store, f"b-{n:02d}", DAYS_AGO_3 + timedelta(seconds=n))
    costs = []
    for expected in (10, 10, 5):
        before_table, before_blob = store.ops.copy(), dict(archive.ops)
        report = tick(store=store, archive=archive, policy=policy(max_orders=10), now=NOW)
        assert report["archived"] == report["deleted"] == expected
        costs.append((sum((store.ops - before_table).values()), sum(archive.ops.values()) - sum(before_blob.values())))
    # Table requests: per order one partition read and one delete, per index partition the
    # batch spans one mark and one delete transaction, and the due ranges' queries: bounded by
    # what the tick deletes, whatever is left behind (15 orders after the first tick).
    for (table, blob), orders in zip(costs, (10, 10, 5)):
        # (3 per order: its partition read, its delete, and its customer-index row's delete
        # by adapters.search.forget; none of these orders ended in Error.)
        assert table <= 3 * orders + 2 * min(orders, store.shards) + 2, costs
        assert blob <= 5, costs  # list the day's blobs, its block list, stage, commit (and the container once)
    assert len(archived(archive, retention.day_of(DAYS_AGO_3))) == 25


def archived_in_parts(store, archive, monkeypatch, prefix: str, count: int) -> str:
    """``count`` orders archived one tick each into blobs of two blocks: the day, in parts."""
    monkeypatch.setattr(retention, "MAX_BLOCKS_PER_BLOB", 2)
    for n in range(count):
        end(store, f"{prefix}-{n}", DAYS_AGO_3 + timedelta(seconds=n))
    for _ in range(count):
        tick(store=store, archive=archive, policy=policy(max_orders=1), now=NOW)
    return retention.day_of(DAYS_AGO_3)


def test_a_full_blob_rolls_over_to_the_days_next_part(store, archive, monkeypatch):
    day = archived_in_parts(store, archive, monkeypatch, "p", 5)
    assert [(p.number, len(p.blocks)) for p in archive.day(day).parts] == [(0, 2), (1, 2), (2, 1)]
    assert sorted(doc["order_id"] for doc in archived(archive, day)) == [f"p-{n}" for n in range(5)]
    # Pages of two run across the parts (a page may end at a part's last byte).
    assert every_page(archive, day, limit=2) == [doc["order_id"] for doc in archived(archive, day)]


def every_page(archive: Archive, day: str, *, limit: int) -> list[str]:
    """Every order of a day's archive through GET /api/archive/{day}'s pages."""
    seen, token = [], None
    while True:
        params = {"limit": str(limit), **({"continuation": token} if token else {})}
        reply = archive_api.list_day(day, params, archive=archive)
        assert reply.status == 200, reply.body
        seen += [o["order_id"] for o in reply.body["orders"]]
        token = reply.body["continuation"]
        if token is None:
            return seen


def test_the_archive_is_read_back_by_day_and_by_order(store, archive):
    for n in range(7):
        end(store, f"a-{n}", DAYS_AGO_3 + timedelta(seconds=n))
    for _ in range(3):
        tick(store=store, archive=archive, policy=policy(max_orders=3), now=NOW)
    day = retention.day_of(DAYS_AGO_3)
    # The day, page by page.
    seen = every_page(archive, day, limit=3)
    # Every order once, in the order archived (a tick takes the index's rows shard by shard).
    assert seen == [doc["order_id"] for doc in archived(archive, day)]
    assert sorted(seen) == [f"a-{n}" for n in range(7)]
    # One order.
    reply = archive_api.get_archived(day, "a-4", archive=archive)
    assert reply.status == 200 and reply.body["order_id"] == "a-4" and reply.body["state"] == "Processed"
    assert reply.body["order"]["order_id"] == "a-4" and "archived_at" in reply.body
    # Refusals.
    assert archive_api.get_archived(day, "nope", archive=archive).status == 404
    assert archive_api.list_day("2000-01-01", {}, archive=archive).status == 404
    # ordersctl archive show: the same, as JSON.
    assert json.loads(show(archive, day))["count"] == 7
    assert json.loads(show(archive, day, order="a-6"))["order_id"] == "a-6"
    with pytest.raises(NotArchived):
        show(archive, day, order="zz")
    with pytest.raises(ValueError):
        show(archive, "25-11-2026")


def forged(part: int, offset: int) -> str:
    """A continuation as GET /api/archive/{day} writes one (base64 of ``part:offset``), for any cursor."""
    return base64.urlsafe_b64encode(f"{part}:{offset}".encode()).rstrip(b"=").decode()


def test_a_continuation_that_is_not_where_a_line_starts_is_refused_and_a_real_one_reads_on(store, archive, monkeypatch):
    from api.orders import BadRequest

    day = archived_in_parts(store, archive, monkeypatch, "c", 3)
    assert [(p.number, len(p.blocks)) for p in archive.day(day).parts] == [(0, 2), (1, 1)]
    order = [doc["order_id"] for doc in archived(archive, day)]
    raw = archive.container.get_blob_client(f"orders/{day}.jsonl").download_blob().readall()
    first_end = raw.index(b"\n") + 1  # where part 0's second line starts
    assert 0 < first_end < len(raw) and raw.endswith(b"\n")

    def listed(part: int, offset: int) -> list[str]:
        reply = archive_api.list_day(day, {"continuation": forged(part, offset)}, archive=archive)
        assert reply.status == 200, reply.body
        return [o["order_id"] for o in reply.body["orders"]]

    # Where a line starts (as a page's continuation points): the orders from there on.
    assert listed(0, first_end) == order[1:]
    assert listed(0, len(raw)) == order[2:]  # part 0's end: part 1 next
    assert listed(1, 0) == order[2:]
    # Inside a line (the first byte of a line is not a start: a line starts after a newline),
    # past a part's end, or in a part that is not there: refused, no partial line parsed.
    for part, offset in ((0, 1), (0, first_end // 2), (0, first_end - 1), (0, first_end + 1), (0, len(raw) - 1),
                         (0, len(raw) + 1), (0, len(raw) + 10_000), (1, 5), (2, 0), (2, first_end), (9, 1)):
        with pytest.raises(BadRequest, match="continuation is not a token from a previous page"):
            archive_api.list_day(day, {"continuation": forged(part, offset)}, archive=archive)
    # The pages a client follows still read every order once.
    assert every_page(archive, day, limit=1) == order


@pytest.mark.parametrize(
    ("day", "params"),
    [("2026-02-30", {}), ("today", {}), ("2026-11-25", {"limit": "0"}), ("2026-11-25", {"continuation": "%%"}),
     ("2026-11-25", {"state": "Processed"})],
)
def test_bad_archive_requests_are_refused_with_a_reason(archive, day, params):
    from api.orders import BadRequest

    with pytest.raises(BadRequest):
        archive_api.list_day(day, params, archive=archive)


def test_the_archive_routes_over_http_by_role(app_settings, funchost):
    import requests

    from adapters.wiring import services
    from core import names
    from core.access import OPERATOR_ROLE, READER_ROLE
    from tests.integration.test_api import assert_refused, principal

    s = services()
    end(s.store, "h-1", DAYS_AGO_3)
    assert tick(store=s.store, archive=s.archive(), policy=policy(), now=NOW)["archived"] == 1
    day = retention.day_of(DAYS_AGO_3)
    (host,) = funchost.start(
        env={names.API_AUTH_SETTING: "easyauth"}, functions=("list_archived", "get_archived_order")
    )
    api = f"{host.http_url}/api/archive"
    assert_refused(requests.get(f"{api}/{day}", timeout=10), 401, "unauthorized")
    assert_refused(requests.get(f"{api}/{day}/orders/h-1", headers=principal(), timeout=10), 403, "forbidden")
    for role in (READER_ROLE, OPERATOR_ROLE):
        listed = requests.get(f"{api}/{day}", headers=principal(role), timeout=10)
        assert listed.status_code == 200 and [o["order_id"] for o in listed.json()["orders"]] == ["h-1"], listed.text
        one = requests.get(f"{api}/{day}/orders/h-1", headers=principal(role), timeout=10)
        assert one.status_code == 200 and one.json()["state"] == "Processed"
    reader = principal(READER_ROLE)
    assert_refused(requests.get(f"{api}/{day}/orders/h-2", headers=reader, timeout=10), 404, "not_found", "h-2")
    assert_refused(requests.get(f"{api}/1999-01-01", headers=reader, timeout=10), 404, "not_found", "1999-01-01")
    assert_refused(requests.get(f"{api}/2026-02-30", headers=reader, timeout=10), 400, "bad_request", "date")
    assert_refused(requests.get(f"{api}/{day}/orders/bad%20id", headers=reader, timeout=10), 400, "bad_request")
    assert_refused(requests.get(f"{api}/{day}", params={"limit": "x"}, headers=reader, timeout=10), 400, "bad_request")
    # A continuation pointing inside a line (forged: a page's points where a line starts) is a 400, not a 500.
    assert_refused(requests.get(f"{api}/{day}", params={"continuation": forged(0, 7)}, headers=reader, timeout=10),
                   400, "bad_request", "continuation")
    assert_refused(requests.post(f"{api}/{day}", headers=reader, timeout=10), 405, "method_not_allowed", "GET")
