"""adapters/http_answer.py: an answer read by :class:`LeanHTTPResponse` is the answer
``http.client`` reads, header for header, on generated answers and on the shapes storage
sends; the stdlib code it mirrors is the one reviewed."""

from __future__ import annotations

import email._policybase
import email.feedparser
import hashlib
import http.client
import inspect
import io

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.http_answer import LeanHTTPConnection, LeanHTTPResponse, LeanHTTPSConnection, plain_headers


class _Socket:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, *args, **kwargs):
        return io.BytesIO(self._data)


def _read(cls, raw: bytes, method: str = "GET") -> dict:
    answer = cls(_Socket(raw), method=method)
    try:
        answer.begin()
        body = answer.read()
    except http.client.HTTPException as error:  # the same refusal either way
        return {"error": type(error).__name__}
    read = {
        "status": answer.status, "reason": answer.reason, "version": answer.version,
        "headers": answer.getheaders(), "chunked": answer.chunked, "will_close": answer.will_close,
        "length": answer.length, "body": body, "content_type": answer.headers.get_content_type(),
        "is_multipart": answer.headers.is_multipart(),
    }
    if answer.headers.get_content_maintype() != "multipart":  # there the parser's defects differ (the module)
        payload = answer.headers.get_payload()
        read["payload"] = [part.items() for part in payload] if isinstance(payload, list) else payload
        read["defects"] = [type(defect).__name__ for defect in answer.headers.defects]
    return read


def _same(raw: bytes, method: str = "GET") -> None:
    assert _read(LeanHTTPResponse, raw, method) == _read(http.client.HTTPResponse, raw, method)


BATCH_ANSWER = (
    b"HTTP/1.1 202 Accepted\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Type: multipart/mixed; boundary=batchresponse_5d5a1c52-6d4b-4e7e-9d36-1bb0c4b1a7f2\r\n"
    b"Server: Azurite-Table/3.35.0\r\nx-ms-request-id: 8d1f7e6e-1b5f-4a0b-9a51-3c4f6e6c7d10\r\n"
    b"x-ms-version: 2019-02-02\r\nDate: Fri, 27 Nov 2026 13:00:00 GMT\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n"
)
PART = (
    b"HTTP/1.1 204 No Content\r\nX-Content-Type-Options: nosniff\r\nCache-Control: no-cache\r\n"
    b"DataServiceVersion: 3.0;\r\nETag: W/\"datetime'2026-11-27T13%3A00%3A00.1234567Z'\"\r\n\r\n"
)


def test_the_storage_shapes_read_alike_and_take_the_lean_path():
    for raw, method in ((BATCH_ANSWER, "POST"), (PART, "PATCH")):
        _same(raw, method)
        head = raw.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
        assert plain_headers([line + b"\r\n" for line in head] + [b"\r\n"]) is not None


def test_a_message_answer_goes_to_the_email_parser():
    assert plain_headers([b"Content-Type: message/http\r\n", b"\r\n"]) is None
    _same(b"HTTP/1.1 200 OK\r\nContent-Type: message/http\r\nContent-Length: 0\r\n\r\n")


def test_what_is_not_plain_goes_to_the_email_parser_and_reads_alike():
    folded = b"HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 0\r\n\r\n"
    no_colon = b"HTTP/1.1 200 OK\r\nX-A one\r\nContent-Length: 0\r\n\r\n"
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"
    continued = b"HTTP/1.1 100 Continue\r\nX-B: 1\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    for raw in (folded, no_colon, cut, continued):
        _same(raw)
    assert plain_headers([b"X-A: one\r\n", b" two\r\n", b"\r\n"]) is None
    assert plain_headers([b"X-A one\r\n", b"\r\n"]) is None
    assert plain_headers([b"Content-Length: 0\r\n", b""]) is None


_NAME = st.text(st.sampled_from("!#$%&'*+-.^_`|~0123456789abcdefgXYZ:; \t()<>@,\"/[]?={}"), min_size=0, max_size=12)
_VALUE = st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=30)


@settings(max_examples=400, deadline=None)
@given(
    headers=st.lists(st.tuples(_NAME, _VALUE, st.sampled_from([b"\r\n", b"\n"])), max_size=8),
    status=st.sampled_from([b"200 OK", b"201 Created", b"204 No Content", b"304 Not Modified", b"412 Precondition"]),
    framing=st.sampled_from(["length", "chunked", "close", "none"]),
    method=st.sampled_from(["GET", "HEAD", "POST"]),
    content_type=st.sampled_from([None, "application/json", "multipart/mixed; boundary=b_1", "message/http",
                                  "text/plain; charset=utf-8", "multipart/mixed"]),
)
def test_generated_answers_read_alike(headers, status, framing, method, content_type):
    lines = [name.encode("latin-1") + b":" + value.encode("latin-1") + end for name, value, end in headers]
    if content_type is not None:
        lines.insert(0, b"Content-Type: " + content_type.encode() + b"\r\n")
    framing_lines = {
        "length": [b"Content-Length: 4\r\n"],
        "chunked": [b"Transfer-Encoding: chunked\r\n"],
        "close": [b"Connection: close\r\n"],
        "none": [],
    }[framing]
    body = b"4\r\nbody\r\n0\r\n\r\n" if framing == "chunked" else b"body"
    raw = b"HTTP/1.1 " + status + b"\r\n" + b"".join(framing_lines + lines) + b"\r\n" + body
    _same(raw, method)


#: The stdlib code adapters/http_answer.py mirrors, as reviewed on CPython 3.13 (the app's
#: runtime). A Python whose ``begin`` or ``parse_headers`` changed fails here: read the
#: change, bring the module in line, then set the digest.
MIRRORED = {
    "HTTPResponse.begin": (http.client.HTTPResponse.begin, "e06ec06b08"),
    "parse_headers": (http.client.parse_headers, "b1714190c5"),
    "_parse_header_lines": (http.client._parse_header_lines, "57040866e3"),
    "_read_headers": (http.client._read_headers, "6c136b6373"),
    "FeedParser._parse_headers": (email.feedparser.FeedParser._parse_headers, "68a180f6d4"),
    "Compat32.header_source_parse": (email._policybase.Compat32.header_source_parse, "40e079281d"),
    "HTTPConnection._send_output": (http.client.HTTPConnection._send_output, "69694d6da8"),
}


def test_the_stdlib_code_mirrored_is_the_one_reviewed():
    for name, (code, expected) in MIRRORED.items():
        found = hashlib.sha256(inspect.getsource(code).encode()).hexdigest()[:10]
        assert found == expected, f"http.client's {name} changed: check adapters/http_answer.py, then set {found!r}"


class _Sends:
    """Stands in for a connected socket: records each ``sendall``."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def sendall(self, data) -> None:
        self.sent.append(bytes(data))


def _sent(cls, method: str, body, headers: dict[str, str], **kwargs) -> list[bytes]:
    connection = cls("127.0.0.1", 1)
    connection.sock = _Sends()
    connection.request(method, "/acct/t(PartitionKey='p',RowKey='r')", body=body, headers=headers, **kwargs)
    return connection.sock.sent


@settings(max_examples=200, deadline=None)
@given(
    method=st.sampled_from(["PUT", "POST", "PATCH", "MERGE", "GET", "DELETE"]),
    body=st.one_of(st.none(), st.binary(max_size=3000)),
    headers=st.dictionaries(st.from_regex(r"x-ms-[a-z]{1,12}", fullmatch=True),
                            st.from_regex(r"[ -~]{0,40}", fullmatch=True).map(str.strip), max_size=6),
)
def test_a_request_goes_out_as_http_client_sends_it_in_one_send(method, body, headers):
    for lean_kind, stdlib_kind in ((LeanHTTPConnection, http.client.HTTPConnection),
                                   (LeanHTTPSConnection, http.client.HTTPSConnection)):
        lean = _sent(lean_kind, method, body, headers)
        stdlib = _sent(stdlib_kind, method, body, headers)
        assert b"".join(lean) == b"".join(stdlib)  # the same bytes on the wire
        assert len(lean) == 1  # the header block and the body together


def test_a_body_that_is_not_bytes_goes_through_http_client_as_it_is_and_text_as_its_bytes():
    chunks = [b"ab", b"cd"]
    lean = _sent(LeanHTTPConnection, "PUT", iter(chunks), {}, encode_chunked=True)
    stdlib = _sent(http.client.HTTPConnection, "PUT", iter(chunks), {}, encode_chunked=True)
    assert lean == stdlib and len(lean) > 1
    # bytes asked to go chunked: http.client gives them a Content-Length instead; the same bytes
    lean = _sent(LeanHTTPConnection, "PUT", b"abcd", {}, encode_chunked=True)
    assert b"".join(lean) == b"".join(_sent(http.client.HTTPConnection, "PUT", b"abcd", {}, encode_chunked=True))
    # A str body is encoded (ISO-8859-1) by http.client before it is sent: bytes by then, one send.
    text = _sent(LeanHTTPConnection, "PUT", "zoë", {"Content-Type": "text/plain"})
    assert text == [b"".join(_sent(http.client.HTTPConnection, "PUT", "zoë", {"Content-Type": "text/plain"}))]
