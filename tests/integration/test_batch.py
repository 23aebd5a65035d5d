"""Table transactions through the lean path (adapters/batch.py) against Azurite, beside the
SDK's own path: the same request on the wire, the same answers and errors, the same rows.

Each case runs the same operations twice, once through the SDK's ``TableClient`` and once
through ``LeanTableClient``, over the real SDK and real sockets, each on its own table
(names of one length) holding the same rows before. The boundaries' uuids and the date are
fixed for the comparison, so the two ``$batch`` requests the transport is handed must be
equal but for the table's name, the rows' ETags (of the same length) and the request id:
method, URL, every header (the shared-key signature included) in order, and the body byte
for byte. The lean runs go through neither the ``email`` package's generator nor azure-core's
multipart parser (``http.client`` still reads each answer's headers with the ``email`` parser)."""

from __future__ import annotations

import email.generator
import itertools
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from wsgiref.handlers import format_date_time

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError
from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import TableServiceClient, TableTransactionError, UpdateMode
from azure.data.tables import _base_client as sdk_base_client
from azure.data.tables import _policies as sdk_policies
from azure.core.utils import _pipeline_transport_rest_shared as sdk_multipart

from adapters import batch, wiring
from adapters.clients import development_storage
from adapters.transport import shared_session
from tools.storage_faults import BUSY, proxied, start_in_thread, upstreams_of

OLD_ETAG = "W/\"datetime'2026-01-01T00%3A00%3A00.0000000Z'\""


class Recording(RequestsTransport):
    """The storage transport of the app (the shared session), keeping each ``$batch`` request it is handed."""

    def __init__(self):
        super().__init__(session=shared_session(), session_owner=False, use_env_settings=False)
        self.sent = []

    def send(self, request, **kwargs):
        if request.url.endswith("/$batch"):
            self.sent.append((request.method, request.url, list(request.headers.items()), request.content))
        return super().send(request, **kwargs)


@pytest.fixture
def pair(storage_connection_string, unique_name, monkeypatch):
    """(SDK table, lean table, transport of each), the two tables created empty; uuids and dates fixed."""
    counter = itertools.count(1)
    monkeypatch.setattr(sdk_base_client, "uuid4", lambda: uuid.UUID(int=next(counter)))
    monkeypatch.setattr(batch, "random_uuid", lambda: uuid.UUID(int=next(counter)))
    now = format_date_time(0)  # any fixed date: Azurite does not check its skew
    monkeypatch.setattr(sdk_policies, "format_date_time", lambda _: now)
    tables, transports = [], []
    for kind in (TableServiceClient, batch.LeanTableServiceClient):
        transports.append(Recording())
        service = kind.from_connection_string(storage_connection_string, transport=transports[-1])
        tables.append(service.create_table(unique_name("batch")))
    assert type(tables[0]).__name__ == "TableClient" and isinstance(tables[1], batch.LeanTableClient)

    def restart():
        nonlocal counter
        counter = itertools.count(1)

    yield tables, transports, restart
    for table in tables:
        table.delete_table()


def no_email(monkeypatch):
    """Make every use of the email package's generator or azure-core's multipart parser fail."""
    def boom(*args, **kwargs):
        raise AssertionError("the lean path went through the email package")
    monkeypatch.setattr(email.generator.BytesGenerator, "flatten", boom)
    monkeypatch.setattr(sdk_multipart, "message_parser", boom)


def entity(row: str, **properties):
    return {"PartitionKey": "o-1", "RowKey": row, **properties}


def outcome(table, operations):
    """The transaction's result (each part's metadata keys) or its error (type, status, code,
    message without Azurite's request id and time)."""
    try:
        return ("ok", [sorted(part) for part in table.submit_transaction(operations)])
    except HttpResponseError as error:
        message = re.sub(r"\n(RequestId|Time):[^\n]*", "", error.message)
        return (type(error), error.status_code, error.error_code, message.split("\nContent:")[0])


def line(n: int):
    return entity(f"line-{n:02d}", Kind="action", Step=f"step{n}", Attempt=1, Outcome="applied")


#: name -> (rows there before, the transaction as the app writes it, with ETAG for the state row's
#: current ETag). The first three are the app's: the submission, a step's end with the next
#: claim, and its largest (a state row MERGE, every line of a compensated workflow, a seal's
#: deletion); then one at the service's limit, and the three failures the store handles.
CASES = {
    "submission (3 creates)": ([], [
        ("create", entity("order", Document='{"orderId": "o-1", "items": [{"sku": "a", "qty": 2}]}')),
        ("create", entity("state", ProcessState="Pending", Attempt=0, Note="naïve € \n \"quoted\"")),
        ("create", entity("seal-1")),
    ]),
    "a step (If-Match MERGE, upsert, delete *)": ([entity("state", ProcessState="Pending"), entity("seal-1")], [
        ("update", entity("state", ProcessState="Processing", Attempt=1),
         {"mode": UpdateMode.MERGE, "etag": "ETAG", "match_condition": MatchConditions.IfNotModified}),
        ("upsert", line(1), {"mode": UpdateMode.REPLACE}),
        ("delete", entity("seal-1"), {"match_condition": MatchConditions.Unconditionally}),
    ]),
    "the largest step transaction": ([entity("state", ProcessState="Compensating"), entity("seal-2")], [
        ("update", entity("state", ProcessState="Compensated", Attempt=4),
         {"mode": UpdateMode.MERGE, "etag": "ETAG", "match_condition": MatchConditions.IfNotModified}),
        *[("upsert", line(n), {"mode": UpdateMode.REPLACE}) for n in range(1, 7)],
        ("upsert", entity("line-07", Kind="compensation"), {"mode": UpdateMode.MERGE}),
        ("delete", entity("seal-2"), {"match_condition": MatchConditions.Unconditionally}),
    ]),
    "100 creates (the service's limit)": ([], [("create", line(n)) for n in range(100)]),
    "412 on the 2nd entity": ([entity("state", ProcessState="Pending")], [
        ("upsert", line(1)),
        ("update", entity("state", ProcessState="Processing"),
         {"mode": UpdateMode.MERGE, "etag": OLD_ETAG, "match_condition": MatchConditions.IfNotModified}),
    ]),
    "409 on create": ([entity("order")], [("upsert", line(1)), ("create", entity("order"))]),
    "404 (delete * of a row not there)": ([entity("state")], [
        ("update", entity("state", ProcessState="Processing"), {"mode": UpdateMode.MERGE}),
        ("delete", entity("seal-1"), {"match_condition": MatchConditions.Unconditionally}),
    ]),
}


def with_etag(operations, etag):
    return [(op[0], op[1], {**op[2], "etag": etag}) if len(op) > 2 and op[2].get("etag") == "ETAG" else op
            for op in operations]


def comparable(request, table, etag: str):
    """A recorded ``$batch`` request with the table's name and the state row's ETag replaced
    (each the same length on both sides) and without the per-request id."""
    method, url, headers, body = request
    body = body.replace(table.table_name.encode(), b"TABLE")
    if etag:
        body = body.replace(etag.encode(), b"ETAG")
    return method, url, [(k, v) for k, v in headers if k != "x-ms-client-request-id"], body


def partition(table):
    return [dict(row) for row in table.query_entities("PartitionKey eq 'o-1'")]


@pytest.mark.parametrize("case", list(CASES))
def test_a_transaction_is_the_same_on_the_wire_in_its_answer_and_in_its_rows(pair, monkeypatch, case):
    (sdk, lean), (sdk_wire, lean_wire), restart = pair
    before, operations = CASES[case]
    results, etags = [], []
    for table in (sdk, lean):
        for row in before:
            table.create_entity(row)
        etags.append(table.get_entity("o-1", "state").metadata["etag"] if any(r["RowKey"] == "state" for r in before)
                     else "")
        restart()
        if table is lean:
            no_email(monkeypatch)
        results.append(outcome(table, with_etag(operations, etags[-1])))

    assert results[0] == results[1]
    failures = {"412 on the 2nd entity": (412, "UpdateConditionNotSatisfied"),
                "409 on create": (409, "EntityAlreadyExists"),
                "404 (delete * of a row not there)": (404, "ResourceNotFound")}
    if case in failures:
        assert results[0][:3] == (TableTransactionError, *failures[case])
        assert results[0][3].startswith("1:")  # the failing entity's index, as the SDK and the app read it
    else:
        assert results[0] == ("ok", [[] if op[0] == "delete" else ["etag"] for op in operations])
    (sdk_request,), (lean_request,) = sdk_wire.sent, lean_wire.sent
    assert len(etags[0]) == len(etags[1])
    assert comparable(sdk_request, sdk, etags[0]) == comparable(lean_request, lean, etags[1])
    assert partition(sdk) == partition(lean)


def test_the_app_s_tables_take_the_lean_path(app_settings):
    services = wiring.services()
    assert isinstance(services.store.table, batch.LeanTableClient)
    assert isinstance(services.rejections.table, batch.LeanTableClient)


def test_a_transaction_refused_busy_is_sent_again_by_the_sdk_s_retry_policy(azurite, unique_name):
    """Azure's 503 ServerBusy (the fault proxy, before the request reaches Azurite): the lean
    request goes through the SDK's retry policy as the SDK's own did, the same body again."""
    proxy = start_in_thread(upstreams_of(azurite.connection_string), seed=1)
    try:
        wire = Recording()
        service = batch.LeanTableServiceClient.from_connection_string(
            proxied(azurite.connection_string, proxy.endpoints), transport=wire)
        table = service.create_table(unique_name("retry"))
        proxy.inject(BUSY, service="table", method="POST")
        assert len(table.submit_transaction([("create", entity("order")), ("create", entity("state"))])) == 2
        assert proxy.counts()["faults"][BUSY] == 1
        (_, _, _, first), (_, _, _, again) = wire.sent
        assert first == again
        assert sorted(row["RowKey"] for row in table.list_entities()) == ["order", "state"]
        table.delete_table()
    finally:
        proxy.stop()


@pytest.mark.parametrize("note, expected", [("a\n b", ("ok", [["etag"], ["etag"]])), ("café", UnicodeEncodeError)])
def test_a_sub_request_the_lean_encoder_declines_is_written_by_the_sdk(pair, note, expected):
    """A header the lean encoder cannot prove it writes alike (a folded line; a byte past
    ASCII, on which azure-core's own encoder fails): the SDK writes the transaction, the same."""
    (sdk, lean), (sdk_wire, lean_wire), restart = pair
    operations = [("upsert", entity("a"), {"headers": {"x-note": note}}), ("upsert", entity("b"))]
    results = []
    for table in (sdk, lean):
        restart()
        try:
            results.append(outcome(table, operations))
        except UnicodeEncodeError as error:
            results.append(type(error))
    assert results[0] == results[1] == expected
    assert [comparable(r, sdk, "") for r in sdk_wire.sent] == [comparable(r, lean, "") for r in lean_wire.sent]


class _Answering(BaseHTTPRequestHandler):
    """A table endpoint that answers every ``$batch`` with :attr:`answer` (202, multipart/mixed)."""

    protocol_version = "HTTP/1.1"
    answer = b""

    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(202)
        self.send_header("Content-Type", "multipart/mixed; boundary=batchresponse_1")
        self.send_header("Content-Length", str(len(_Answering.answer)))
        self.end_headers()
        self.wfile.write(_Answering.answer)

    def log_message(self, *args):
        pass


def _changeset(*parts: bytes, preamble: bytes = b"") -> bytes:
    return (preamble + b"--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n"
            + b"".join(b"--changesetresponse_1\r\nContent-Type: application/http\r\n"
                       b"Content-Transfer-Encoding: binary\r\n\r\n" + part + b"\r\n" for part in parts)
            + b"--changesetresponse_1--\r\n--batchresponse_1--\r\n")


_CREATED = b"HTTP/1.1 201 Created\r\nETag: W/\"datetime'2026-11-25T05%3A06%3A42Z'\"\r\n\r\n"
_FAILED = (b"HTTP/1.1 412 Precondition Failed\r\nContent-Type: application/json;odata=minimalmetadata;charset=utf-8\r\n"
           b"\r\n{\"odata.error\":{\"code\":\"UpdateConditionNotSatisfied\",\"message\":{\"lang\":\"en-US\","
           b"\"value\":\"1:The update condition specified in the request was not satisfied.\"}}}")


@pytest.mark.parametrize("answer, expected", [
    (_changeset(_CREATED, _CREATED, preamble=b"a preamble\r\n"), ("ok", [["etag"], ["etag"]])),
    (_changeset(_FAILED, preamble=b"a preamble\r\n"), (TableTransactionError, 412, "UpdateConditionNotSatisfied")),
], ids=["applied", "412"])
def test_an_answer_outside_the_strict_form_is_read_by_the_sdk_s_parser_with_the_same_result(
    monkeypatch, answer, expected
):
    """An answer the lean parser declines (here: a preamble before the first boundary, which
    MIME allows and Azurite never sends) is read by the SDK's own parser: the same result or error."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answering)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Answering.answer = answer
    read = []
    lean_parse = batch.changeset_responses
    monkeypatch.setattr(batch, "changeset_responses", lambda *a: read.append(lean_parse(*a)) or read[-1])
    try:
        connection = development_storage(table=server.server_address[1])
        results = []
        for kind in (TableServiceClient, batch.LeanTableServiceClient):
            table = kind.from_connection_string(connection, transport=Recording()).get_table_client("orders")
            results.append(outcome(table, [("create", entity("order")), ("create", entity("state"))]))
    finally:
        server.shutdown()
        server.server_close()
    assert read == [None]  # the lean client's parse declined it; the SDK's parser read it
    assert results[0] == results[1]
    assert results[0][:len(expected)] == expected

