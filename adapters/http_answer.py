"""An HTTP answer's header block read without the ``email`` package.

``http.client.HTTPResponse.begin`` reads the status line, then hands the header lines to
``email.parser`` (``http.client.parse_headers``), a general MIME parser: about 30 µs of CPU
for a storage answer's seven or eight headers, and 150 µs when the answer is
``multipart/mixed``, as every table transaction's is (and each of its parts' is not), because
the parser then compiles a regular expression for the answer's boundary, new in every answer
(``email.feedparser``; Python's ``re`` cache keeps 512 patterns, and every boundary is a new
one). A transaction's answer is parsed twice over: its outer header block and each
sub-response in it (adapters/batch.py), so an order paid that 5 times plus some 20 plain
header blocks (BENCHMARKS.md, "Where the CPU goes, and what was cut").

:class:`LeanHTTPResponse` is ``http.client``'s ``HTTPResponse`` in every respect but one: a
header block in the plain form every storage answer has (each line ``Name: value``, the
name printable ASCII without a colon, no folded continuation line, nothing past Latin-1
that ``http.client`` would decode any differently) becomes an ``HTTPMessage`` with the same
headers (names and values, in the same order, ``set_raw`` as the parser sets them) without
the parser; any other block, and any ``message/*`` answer (the parser reads its body as a
message), goes to the parser exactly as ``http.client.parse_headers`` sends it (CPython 3.13's
``parse_headers`` is ``_read_headers`` then ``_parse_header_lines``: this module calls the two). One difference is left,
which nothing here reads (``lean_http`` and azure-core read the headers only): for a
``multipart/*`` answer the parser also records, in the message's ``defects``, that the block
held no body parts; the lean message records none. The rest of ``begin`` (the status line,
100 Continue, chunked, Content-Length, keep-alive) is CPython 3.13's, the app's runtime
(infra/app/function-app.bicep), unchanged but for that one call; tests/unit/test_http_answer.py
holds the two to the same result on generated answers and pins the code mirrored (a new
Python version fails it until this module is checked against it).
"""

from __future__ import annotations

import http.client
import re
from http.client import CONTINUE, NO_CONTENT, NOT_MODIFIED, HTTPMessage, UnknownProtocol

#: A header line the lean path takes: a name the ``email`` parser reads as one (printable
#: ASCII, no colon, at least one character), a colon, the value, CRLF or LF.
_PLAIN_HEADER = re.compile(rb"([\x21-\x39\x3b-\x7e]+):[ \t]*([^\r\n]*?)\r?\n")


def plain_headers(lines: list[bytes]) -> HTTPMessage | None:
    """The header lines (as ``http.client`` reads them, the blank line last) as the message
    ``parse_headers`` makes of them, or None when any line is not in the plain form."""
    message = HTTPMessage()
    for line in lines[:-1]:
        match = _PLAIN_HEADER.fullmatch(line)
        if match is None:
            return None  # a folded line, a line without a name or a colon: the parser decides
        message.set_raw(match[1].decode("ascii"), match[2].decode("iso-8859-1"))
    if lines[-1] not in (b"\r\n", b"\n"):
        return None  # the answer ended inside its header block: the parser says how
    if message.get_content_maintype() == "message":
        return None  # the parser reads such a body as a message of its own
    message.set_payload("")
    return message


def read_headers(fp) -> HTTPMessage:
    """``http.client.parse_headers(fp)``, without the ``email`` parser when the block is plain."""
    lines = http.client._read_headers(fp)  # noqa: SLF001 - the line reader parse_headers itself uses
    message = plain_headers(lines)
    # parse_headers' own second half: the email parser over the lines read.
    return message if message is not None else http.client._parse_header_lines(lines)  # noqa: SLF001


class LeanHTTPResponse(http.client.HTTPResponse):
    """``HTTPResponse`` whose plain header blocks are read without the ``email`` parser."""

    def begin(self):
        # CPython 3.13's HTTPResponse.begin, its debug output left out, but for the one line
        # marked: read_headers instead of parse_headers.
        if self.headers is not None:
            return
        while True:
            version, status, reason = self._read_status()
            if status != CONTINUE:
                break
            http.client._read_headers(self.fp)  # noqa: SLF001 - skip the 100 answer's headers
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise UnknownProtocol(version)
        self.headers = self.msg = read_headers(self.fp)  # the one change
        tr_enc = self.headers.get("transfer-encoding")
        if tr_enc and tr_enc.lower() == "chunked":
            self.chunked = True
            self.chunk_left = None
        else:
            self.chunked = False
        self.will_close = self._check_close()
        self.length = None
        length = self.headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            else:
                if self.length < 0:
                    self.length = None
        else:
            self.length = None
        if status == NO_CONTENT or status == NOT_MODIFIED or 100 <= status < 200 or self._method == "HEAD":
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True


class _OneSend:
    """A request whose body is ``bytes`` goes out in one ``send``, its header block and body
    together, as ``http.client`` itself sent it until Python 3.6 reworked the method for chunked
    uploads: ``HTTPConnection._send_output`` now sends the two apart (and so does urllib3,
    which sends through it). Each send
    on a socket with a timeout is a ``poll`` and a ``send``, and each lets go of the GIL: under
    load, another thread takes it and this one waits to get it back (BENCHMARKS.md, "Where the
    CPU goes, and what was cut"). The bytes on the wire are the same. Any other body (a file, an
    iterable, chunked) goes through ``http.client`` as it is; CPython 3.13's ``_send_output``,
    which this mirrors for a ``bytes`` body, is pinned in tests/unit/test_http_answer.py."""

    _buffer: list[bytes]

    def _send_output(self, message_body=None, encode_chunked=False):
        if encode_chunked or not isinstance(message_body, bytes):
            return super()._send_output(message_body, encode_chunked=encode_chunked)  # type: ignore[misc]
        self._buffer.extend((b"", b""))
        message = b"\r\n".join(self._buffer) + message_body
        del self._buffer[:]
        self.send(message)  # type: ignore[attr-defined]


class LeanHTTPConnection(_OneSend, http.client.HTTPConnection):
    """``HTTPConnection`` whose answers are :class:`LeanHTTPResponse`, a request sent in one ``send``."""

    response_class = LeanHTTPResponse


class LeanHTTPSConnection(_OneSend, http.client.HTTPSConnection):
    """``HTTPSConnection`` whose answers are :class:`LeanHTTPResponse`, a request sent in one ``send``."""

    response_class = LeanHTTPResponse
