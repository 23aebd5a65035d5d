"""The transactions' ``$batch`` encoder and parser (adapters/batch.py) held to azure-core's own
on generated input, and the SDK code they mirror pinned.

Whatever request or answer Hypothesis makes up, the lean code either declines it (and the
SDK's own code then runs) or gives exactly what the SDK gives: the same body bytes and
Content-Type, the same parts (type, status, reason, headers, body, paired request)."""

from __future__ import annotations

import hashlib
import inspect
import json
from http.client import HTTPResponse

import pytest
from azure.core.pipeline._base import Pipeline
from azure.core.rest import HttpRequest
from azure.core.rest._http_response_impl import RestHttpClientTransportResponse
from azure.core.utils import _pipeline_transport_rest_shared as shared
from azure.data.tables import TableServiceClient
from azure.data.tables._base_client import TablesBaseClient
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from adapters import batch

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

URL = "http://127.0.0.1:10002/devstoreaccount1/orders"

# -- requests ---------------------------------------------------------------------------

# Two kinds of input each way: well formed (what the SDK and Azure produce: the lean code
# must take all of it) and wild (anything else: the lean code gives the SDK's result or declines).
_ascii = st.characters(min_codepoint=0x20, max_codepoint=0x7e)
_methods = {"well": st.sampled_from(["POST", "PUT", "PATCH", "DELETE", "MERGE", "GET", "patch"]),
            "wild": st.sampled_from(["POST", "P0ST", "PO ST", "ÖST", ""])}
_urls = {
    "well": st.builds(lambda pk, rk: f"{URL}(PartitionKey='{pk}',RowKey='{rk}')",
                      st.text("abcXYZ019-_%'.~!*", max_size=12), st.text("abc-_%'", max_size=12)),
    "wild": st.one_of(st.builds(lambda path: URL + path, st.text(st.characters(codec="latin-1"), max_size=12)),
                      st.just("http://[::1/devstoreaccount1/t")),  # urlsplit refuses the last one
}
_token = st.text(st.sampled_from("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
                 min_size=1, max_size=10)
_names = {
    "well": st.one_of(st.sampled_from(["If-Match", "Content-Type", "Content-Length", "Accept", "x-ms-date", "Date",
                                       "DataServiceVersion", "Host", "Accept-Encoding", "host", "Prefer"]), _token),
    "wild": st.one_of(st.sampled_from(["Transfer-Encoding", "x note", "x:y"]),
                      st.text(_ascii, min_size=1, max_size=10)),
}
_values = {
    "well": st.one_of(st.sampled_from(['W/"datetime\'2026-11-25T05%3A06%3A42.4334848Z\'"', "*", "application/json",
                                       "3.0", "", "return-no-content"]), st.text(_ascii, max_size=20)),
    "wild": st.one_of(st.sampled_from(["a\r\n b", "x\ny", "é", "€", "\x00"]),
                      st.text(st.characters(codec="latin-1"), max_size=20)),
}
_entities = st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=20), st.integers(), st.booleans(),
                                                           st.floats(allow_nan=False)), max_size=4)
_bodies = {
    "well": st.one_of(st.none(), _entities.map(lambda entity: ("json", entity)),
                      st.text(_ascii, max_size=40).map(lambda text: ("content", text.encode("ascii")))),
    "wild": st.one_of(st.binary(max_size=40).map(lambda data: ("content", data)),
                      st.text(max_size=40).map(lambda text: ("content", text))),
}


def _either(table: dict, wild: bool):
    return st.one_of(table["well"], table["wild"]) if wild else table["well"]


@st.composite
def sub_requests(draw, wild: bool = False):
    """A factory of equal sub-requests (each side of a comparison gets its own)."""
    method, url, body = draw(_either(_methods, wild)), draw(_either(_urls, wild)), draw(_either(_bodies, wild))
    headers = draw(st.lists(st.tuples(_either(_names, wild), _either(_values, wild)), max_size=6))
    drop_length = draw(st.booleans())

    def make() -> HttpRequest:
        kind, value = body if body is not None else (None, None)
        request = HttpRequest(method, url, **({kind: value} if kind else {}))
        for name, header in headers:
            request.headers[name] = header
        if drop_length:
            request.headers.pop("Content-Length", None)
        return request

    return make


def entity_request(index: int, method: str = "PATCH", etag: str | None = 'W/"datetime\'2026-11-25T05%3A06%3A42Z\'"'):
    """A sub-request as azure-data-tables builds one (a step's state row MERGE with If-Match)."""
    headers = {"Content-Type": "application/json", "x-ms-version": "2019-02-02", "DataServiceVersion": "3.0",
               "Accept": "application/json"}
    if etag:
        headers["If-Match"] = etag
    entity = {"PartitionKey": "o-1", "PartitionKey@odata.type": "Edm.String", "RowKey": f"r{index}",
              "Status": "Processing", "Note": "naïve \u20ac \n"}
    request = HttpRequest(method, f"{URL}(PartitionKey='o-1',RowKey='r{index}')", headers=headers,
                          json=None if method == "DELETE" else entity)
    request.headers["x-ms-date"] = request.headers["Date"] = "Wed, 25 Nov 2026 05:06:42 GMT"
    return request


def sdk_body(requests: list[HttpRequest], batch_boundary: str, changeset_boundary: str) -> tuple[bytes, str]:
    """azure-core's own encoding of a transaction (what Pipeline.run does before sending one)."""
    changeset = HttpRequest("POST", "")
    changeset.set_multipart_mixed(*requests, policies=[], boundary=changeset_boundary)
    outer = HttpRequest("POST", URL + "/$batch")
    outer.set_multipart_mixed(changeset, policies=[], enforce_https=False, boundary=batch_boundary)
    outer.prepare_multipart_body()
    return outer.content, outer.headers["Content-Type"]


def lean_body(requests: list[HttpRequest], batch_boundary: str, changeset_boundary: str) -> bytes | None:
    parts = [batch.application_http(request) for request in requests]
    return None if None in parts else batch.encode_batch(parts, batch_boundary, changeset_boundary)


@PROPERTY
@given(st.lists(sub_requests(), min_size=1, max_size=4), st.uuids(), st.uuids())
def test_a_well_formed_transaction_s_body_is_the_sdks_byte_for_byte(factories, one, two):
    batch_boundary, changeset_boundary = f"batch_{one}", f"changeset_{two}"
    lean = lean_body([make() for make in factories], batch_boundary, changeset_boundary)
    body, content_type = sdk_body([make() for make in factories], batch_boundary, changeset_boundary)
    assert lean == body
    assert content_type == "multipart/mixed; boundary=" + batch_boundary


@PROPERTY
@given(st.lists(sub_requests(wild=True), min_size=1, max_size=4), st.uuids(), st.uuids())
def test_any_transaction_s_body_is_the_sdks_byte_for_byte_or_left_to_the_sdk(factories, one, two):
    batch_boundary, changeset_boundary = f"batch_{one}", f"changeset_{two}"
    lean = lean_body([make() for make in factories], batch_boundary, changeset_boundary)
    event("declined" if lean is None else "written")
    if lean is None:
        return  # declined: the SDK writes this transaction itself (or fails on it, as before)
    assert lean == sdk_body([make() for make in factories], batch_boundary, changeset_boundary)[0]


@pytest.mark.parametrize("count", [1, 2, 3, 100])
def test_the_app_s_transactions_are_written_by_the_lean_encoder(count):
    """Create, update with If-Match, upsert, delete, up to the service's 100 entities: every
    shape the app sends is within what the encoder writes (and written as the SDK writes it)."""
    methods = ["POST", "PATCH", "PUT", "DELETE"]

    def requests():
        return [entity_request(i, methods[i % 4], etag=None if i % 4 == 0 else "*" if i % 4 == 3 else 'W/"x"')
                for i in range(count)]

    lean = lean_body(requests(), "batch_1", "changeset_2")
    assert lean is not None
    assert lean == sdk_body(requests(), "batch_1", "changeset_2")[0]


@pytest.mark.parametrize("change", ["line break in the body", "line break in a header", "folded header",
                                    "non-latin-1 body", "chunked", "header name with a space", "int header"])
def test_what_the_encoder_cannot_prove_is_left_to_the_sdk(change):
    request = entity_request(0)
    if change == "line break in the body":
        request = HttpRequest("PUT", URL, content=b'{"a":\n1}')
    elif change == "line break in a header":
        request.headers["x-note"] = "a\nb"
    elif change == "folded header":
        request.headers["x-note"] = "a\r\n b"
    elif change == "non-latin-1 body":
        request = HttpRequest("PUT", URL, content="€")
    elif change == "chunked":
        request.headers.pop("Content-Length")
        request.headers["Transfer-Encoding"] = "chunked"
    elif change == "header name with a space":
        request.headers["x note"] = "1"
    elif change == "int header":
        request.headers["x-count"] = 1
    assert batch.application_http(request) is None


# -- answers ----------------------------------------------------------------------------

_bchars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'()+_,-./:=?"
_boundaries = {
    "well": st.one_of(st.uuids().map(lambda u: f"batchresponse_{u}"), st.text(_bchars, min_size=1, max_size=70)),
    "wild": st.sampled_from(["a b", "\"quoted\"", "x" * 71, "batchresponse_1 ", "a;b"]),
}
_statuses = st.sampled_from([(201, "Created"), (204, "No Content"), (412, "Precondition Failed"),
                             (409, "Conflict"), (404, "Not Found"), (400, "Bad Request"), (413, "Too Large")])


def pick(draw, wild: bool, well: list, odd: list):
    """One of the well-formed choices, or (wild) of either list."""
    return draw(st.sampled_from(well + odd if wild else well))


@st.composite
def http_responses(draw) -> bytes:
    status, reason = draw(_statuses)
    lines = [f"HTTP/1.1 {status} {reason}"]
    for name in draw(st.lists(st.sampled_from(["ETag", "Content-Type", "X-Content-Type-Options", "Location",
                                                "DataServiceVersion", "Cache-Control", "Preference-Applied",
                                                "Content-ID"]), max_size=4)):
        lines.append(f"{name}: {draw(st.text(_ascii, max_size=30))}")
    body = b""
    if status >= 400:
        message = draw(st.sampled_from(["1:The update condition specified in the request was not satisfied.",
                                        "0:The specified entity already exists.",
                                        "The specified resource does not exist."]))
        body = json.dumps({"odata.error": {"code": "X", "message": {"lang": "en-US", "value": message}}}).encode()
        body += draw(st.binary(max_size=8))
        if draw(st.booleans()):
            lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@st.composite
def part_headers(draw, content_type: str, wild: bool) -> list[str]:
    headers = [f"Content-Type: {content_type}"]
    names = ["Content-ID", "X-Extra", "Content-Length", "Content-Type"]
    names += ["content-transfer-encoding"] if wild else []
    for name in draw(st.lists(st.sampled_from(names), max_size=3)):
        value = draw(st.sampled_from(["binary", "Binary", "base64", "7bit", "1", "", "application/http",
                                      "text/plain", "  spaced  "]))
        headers.append(f"{name}:{draw(st.sampled_from([' ', '', '  ', chr(9)]))}{value}")
    if draw(st.booleans()):
        headers.insert(1, f"Content-Transfer-Encoding: {pick(draw, wild, ['binary', 'Binary'], ['base64', '7bit'])}")
    return headers


@st.composite
def answers(draw, wild: bool = False) -> tuple[str, bytes, int]:
    """(Content-Type, body, number of sub-requests) of a transaction's answer: well formed
    (Azurite's and Azure's shape: any boundary, extra part headers, any HTTP answers, as
    many parts as requests or fewer, as for a failure), or wild (other line endings, blanks
    after a boundary, a preamble, a missing close, other content types, odd boundaries)."""
    outer = draw(_either(_boundaries, wild))
    inner = draw(_either(_boundaries, wild))
    eol = pick(draw, wild, ["\r\n"], ["\n", "\r"])
    leaves = []
    for response in draw(st.lists(http_responses(), min_size=1, max_size=4)):
        kind = pick(draw, wild, ["application/http", "Application/HTTP"],
                    ["application/http; x=1", "text/plain", "application/http ", "application/json"])
        head = eol.join(draw(part_headers(kind, wild))).encode("latin-1")
        leaves.append(head + eol.encode() + eol.encode() + response)
    pad = pick(draw, wild, [""], [" ", "\t "])
    inner_delimiter = f"--{inner}{pad}".encode()
    changeset = inner_delimiter + eol.encode() + (eol.encode() + inner_delimiter + eol.encode()).join(leaves)
    changeset += f"{eol}--{inner}--".encode() + pick(draw, wild, [b"", b"\r\n"], [b"epilogue"])
    inner_type = pick(draw, wild, [f"multipart/mixed; boundary={inner}", f"multipart/mixed;boundary={inner}",
                                   f"Multipart/Mixed; Boundary={inner}"],
                      [f'multipart/mixed; boundary="{inner}"', "application/http",
                       f"multipart/mixed; boundary={inner} "])
    preamble = pick(draw, wild, [b""], [b"preamble\r\n", b"\r\n"])
    if not wild:  # RFC 2046, 5.1.1: a boundary delimiter never appears inside what it encloses
        assume(f"--{outer}".encode() not in changeset and all(f"--{inner}".encode() not in leaf for leaf in leaves))
    body = preamble + f"--{outer}{eol}Content-Type: {inner_type}{eol}{eol}".encode() + changeset
    body += pick(draw, wild, [f"{eol}--{outer}--{eol}".encode(), f"{eol}--{outer}--".encode()], [b"", b"\r\n--x--"])
    content_type = pick(draw, wild, [f"multipart/mixed; boundary={outer}", f"multipart/mixed;boundary={outer}"],
                        [f"Multipart/Mixed; boundary={outer}", "application/json",
                         f'multipart/mixed; boundary="{outer}"'])
    return content_type, body, draw(st.integers(min_value=1, max_value=4))


def answer(content_type: str, body: bytes, requests: list[HttpRequest]) -> RestHttpClientTransportResponse:
    """A 202 answer to a transaction of ``requests``, with the multipart info the SDK's parser reads."""
    changeset = HttpRequest("POST", "")
    changeset.set_multipart_mixed(*requests, policies=[], boundary="changeset_1")
    outer = HttpRequest("POST", URL + "/$batch")
    outer.set_multipart_mixed(changeset, policies=[], enforce_https=False, boundary="batch_1")
    head = f"HTTP/1.1 202 Accepted\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    raw = HTTPResponse(shared.BytesIOSocket(head.encode("latin-1") + body), method="POST")
    raw.begin()
    response = RestHttpClientTransportResponse(request=outer, internal_response=raw)
    response.read()
    return response


def described(parts, response, requests) -> list[tuple]:
    """Each part's type, status, reason, headers, body and request (its position, or the outer one)."""
    def which(request):
        return "outer" if request is response.request else next(i for i, r in enumerate(requests) if r is request)

    return [(type(p), p.status_code, p.reason, list(p.headers.items()), p.read(), which(p.request)) for p in parts]


def lean_and_sdk_parts(case) -> tuple[list | None, list]:
    content_type, body, count = case
    requests = [entity_request(i) for i in range(count)]
    mine, theirs = answer(content_type, body, requests), answer(content_type, body, requests)
    lean = batch.changeset_responses(mine, requests)
    sdk = described(list(theirs.parts()), theirs, requests)
    return (None if lean is None else described(lean, mine, requests)), sdk


@PROPERTY
@given(answers())
def test_a_well_formed_answer_s_parts_are_the_sdks(case):
    lean, sdk = lean_and_sdk_parts(case)
    assert lean == sdk


@PROPERTY
@given(answers(wild=True))
def test_any_answer_s_parts_are_the_sdks_or_left_to_the_sdk(case):
    content_type, body, count = case
    requests = [entity_request(i) for i in range(count)]
    mine, theirs = answer(content_type, body, requests), answer(content_type, body, requests)
    lean = batch.changeset_responses(mine, requests)
    event("declined" if lean is None else "read")
    if lean is None:
        return  # declined: the SDK's parser reads this answer (or fails on it, as before)
    assert described(lean, mine, requests) == described(list(theirs.parts()), theirs, requests)


def test_an_answer_as_azurite_and_azure_shape_it_is_read_by_the_lean_parser():
    """Azurite's answer to a failed transaction (one part: the failing entity's index in the
    message), and the form of Azure's documented sample (Content-ID inside each part's HTTP
    response): both within the strict form, so the lean path reads them."""
    failed = (b"--batchresponse_9\r\nContent-Type: multipart/mixed; boundary=changesetresponse_9\r\n\r\n"
              b"--changesetresponse_9\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n"
              b"HTTP/1.1 412 Precondition Failed\r\n"
              b"Content-Type: application/json;odata=minimalmetadata;charset=utf-8\r\n"
              b"\r\n{\"odata.error\":{\"code\":\"UpdateConditionNotSatisfied\",\"message\":{\"lang\":\"en-US\","
              b"\"value\":\"1:The update condition specified in the request was not satisfied.\"}}}\r\n"
              b"--changesetresponse_9--\r\n--batchresponse_9--\r\n")
    documented = (b"--batchresponse_4c637ba4\r\n"
                  b"Content-Type: multipart/mixed; boundary=changesetresponse_ac6a9b5f\r\n\r\n"
                  + b"".join(b"--changesetresponse_ac6a9b5f\r\nContent-Type: application/http\r\n"
                             b"Content-Transfer-Encoding: binary\r\n\r\nHTTP/1.1 201 Created\r\nContent-ID: %d\r\n"
                             b"Cache-Control: no-cache\r\nETag: W/\"datetime'2026-11-25T05%%3A06%%3A42Z'\"\r\n"
                             b"DataServiceVersion: 3.0;\r\n\r\n\r\n" % i for i in (1, 2))
                  + b"--changesetresponse_ac6a9b5f--\r\n--batchresponse_4c637ba4--\r\n")
    for content_type, body, count in [("multipart/mixed; boundary=batchresponse_9", failed, 2),
                                      ("multipart/mixed; boundary=batchresponse_4c637ba4", documented, 2)]:
        requests = [entity_request(i) for i in range(count)]
        mine, theirs = answer(content_type, body, requests), answer(content_type, body, requests)
        lean = batch.changeset_responses(mine, requests)
        assert lean is not None
        assert described(lean, mine, requests) == described(list(theirs.parts()), theirs, requests)
    assert lean[1].headers["ETag"] == "W/\"datetime'2026-11-25T05%3A06%3A42Z'\""


# -- the SDK code mirrored ---------------------------------------------------------------

#: The SDK code adapters/batch.py mirrors or relies on, as reviewed against azure-core 1.41.0
#: and azure-data-tables 12.7.0 (requirements.txt). A new version that changes any of them
#: fails here: read the change, bring adapters/batch.py in line, then update the digest.
MIRRORED = {
    "TablesBaseClient._batch_send": (TablesBaseClient._batch_send, "0ada8524fa"),
    "TableServiceClient.get_table_client": (TableServiceClient.get_table_client, "1cf6abb883"),
    "_prepare_multipart_body_helper": (shared._prepare_multipart_body_helper, "8d1d3a8a6e"),
    "_serialize_request": (shared._serialize_request, "8431f9c888"),
    "_HTTPSerializer": (shared._HTTPSerializer, "58e04117d2"),
    "_get_raw_parts_helper": (shared._get_raw_parts_helper, "b1054b7095"),
    "_decode_parts_helper": (shared._decode_parts_helper, "42432e278d"),
    "_parts_helper": (shared._parts_helper, "be9494dfd0"),
    "Pipeline._prepare_multipart_mixed_request": (Pipeline._prepare_multipart_mixed_request, "320cf1e96a"),
    "Pipeline._prepare_multipart": (Pipeline._prepare_multipart, "086ca1bddc"),
}


def digest(code) -> str:
    return hashlib.sha256(inspect.getsource(code).encode()).hexdigest()[:10]


@pytest.mark.parametrize("name", sorted(MIRRORED))
def test_the_sdk_code_mirrored_is_the_one_reviewed(name):
    code, expected = MIRRORED[name]
    assert digest(code) == expected, (
        f"{name} changed in the installed SDK: adapters/batch.py mirrors it; check the module against the new "
        f"code, then set its digest here to {digest(code)!r}"
    )
