"""Which faults the proxy injects, at what rates, and what Azure Storage answers for each.

Rates are per request, at each service the proxy fronts. Three kinds exclude each
other (a request gets at most one): ``503`` ServerBusy before the request reaches the
store (not applied), ``500-applied`` OperationTimedOut after the store applied it, and
``reset-applied``, the connection dropped after the store applied it (no answer at
all). ``latency`` is drawn on its own: a share of requests, faulted or not, waits this
long before it is forwarded.

The error bodies are Azure Storage's, per service: XML for queues and blobs, the
OData JSON error for tables (the SDK asks tables for ``application/json``). Sources:
https://learn.microsoft.com/rest/api/storageservices/common-rest-api-error-codes
(ServerBusy 503 "The server is currently unable to receive requests. Please retry your
request." / "Ingress is over the account limit."; OperationTimedOut 500 "The operation
could not be completed within the permitted time."),
https://learn.microsoft.com/rest/api/storageservices/status-and-error-codes2 (the
``x-ms-error-code`` header and the XML body),
https://learn.microsoft.com/rest/api/storageservices/table-service-error-codes (tables'
JSON ``odata.error`` body).
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone

#: The fault kinds, as the command line and the counts name them.
BUSY, APPLIED_500, RESET_APPLIED, LATENCY = "503", "500-applied", "reset-applied", "latency"
KINDS = (BUSY, APPLIED_500, RESET_APPLIED, LATENCY)
#: A fault only a test injects (``FaultProxy.inject``), never drawn at a rate: the connection
#: dropped before the request is forwarded, so nothing applied and no answer: what the SDK sees
#: of a front end that resets a connection under load, as for ``reset-applied``.
RESET = "reset"
#: Not a fault, and only for a test's script (``FaultProxy.inject``): the request goes through
#: untouched, so that the fault scripted after it lands on a later request of a sequence.
PASS = "pass"

BUSY_MESSAGE = "The server is currently unable to receive requests. Please retry your request."
TIMED_OUT_MESSAGE = "The operation could not be completed within the permitted time."


@dataclass(frozen=True)
class StorageFaults:
    """Fault rates per request (0 to 1). ``latency_seconds``: how long a latency spike waits."""

    busy: float = 0.0
    applied_500: float = 0.0
    reset_applied: float = 0.0
    latency: float = 0.0
    latency_seconds: float = 0.5

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not 0 <= value <= (1 if field.name != "latency_seconds" else 60):
                raise ValueError(f"{field.name} must be between 0 and {1 if field.name != 'latency_seconds' else 60}")
        if self.busy + self.applied_500 + self.reset_applied > 1:
            raise ValueError("503, 500-applied and reset-applied together must not exceed 1")

    @classmethod
    def default(cls) -> StorageFaults:
        """The soak's rates under ``--azure-faults``: 2% busy, 1% each applied-then-failed, 5% 0.5 s spikes."""
        return cls(busy=0.02, applied_500=0.01, reset_applied=0.01, latency=0.05, latency_seconds=0.5)

    @classmethod
    def parse(cls, text: str) -> StorageFaults:
        """``503=0.02,500-applied=0.01,reset-applied=0.01,latency=0.05:0.5`` (any subset; ``none`` for none)."""
        values: dict[str, float] = {}
        if text.strip().lower() in ("", "none", "off"):
            return cls()
        for item in text.split(","):
            kind, sep, value = item.strip().partition("=")
            if not sep or kind not in KINDS:
                raise ValueError(f"{item!r}: expected KIND=RATE with KIND one of {', '.join(KINDS)}")
            rate, _, seconds = value.partition(":")
            try:
                values[kind] = float(rate)
                if seconds:
                    if kind != LATENCY:
                        raise ValueError
                    values["latency_seconds"] = float(seconds)
            except ValueError:
                raise ValueError(f"{item!r}: a rate is a number from 0 to 1 (latency=RATE:SECONDS)") from None
        return cls(
            busy=values.get(BUSY, 0.0), applied_500=values.get(APPLIED_500, 0.0),
            reset_applied=values.get(RESET_APPLIED, 0.0), latency=values.get(LATENCY, 0.0),
            latency_seconds=values.get("latency_seconds", cls.latency_seconds),
        )

    def to_arg(self) -> str:
        """The command-line form :meth:`parse` reads back."""
        return (f"{BUSY}={self.busy:g},{APPLIED_500}={self.applied_500:g},{RESET_APPLIED}={self.reset_applied:g},"
                f"{LATENCY}={self.latency:g}:{self.latency_seconds:g}")

    @property
    def any(self) -> bool:
        return bool(self.busy or self.applied_500 or self.reset_applied or self.latency)

    def scaled(self, factor: float) -> StorageFaults:
        return replace(self, busy=self.busy * factor, applied_500=self.applied_500 * factor,
                       reset_applied=self.reset_applied * factor, latency=min(1.0, self.latency * factor))

    def draw(self, rng: random.Random) -> tuple[str | None, bool]:
        """(the exclusive fault for one request, or None; whether it waits a latency spike first)."""
        r = rng.random()
        fault = None
        if r < self.busy:
            fault = BUSY
        elif r < self.busy + self.applied_500:
            fault = APPLIED_500
        elif r < self.busy + self.applied_500 + self.reset_applied:
            fault = RESET_APPLIED
        return fault, rng.random() < self.latency


def error_response(service: str, status: int, code: str, message: str) -> tuple[dict[str, str], bytes]:
    """Headers and body of Azure Storage's error answer for ``service`` (``table``, ``queue``, ``blob``)."""
    request_id = str(uuid.uuid4())
    now = datetime.now(timezone.utc)
    detail = f"{message}\nRequestId:{request_id}\nTime:{now.strftime('%Y-%m-%dT%H:%M:%S.%f')}0Z"
    headers = {
        "x-ms-request-id": request_id,
        "x-ms-version": "2019-02-02",
        "x-ms-error-code": code,
        "Date": now.strftime("%a, %d %b %Y %H:%M:%S GMT"),
    }
    if service == "table":
        headers["Content-Type"] = "application/json;odata=minimalmetadata;streaming=true;charset=utf-8"
        body = json.dumps({"odata.error": {"code": code, "message": {"lang": "en-US", "value": detail}}},
                          separators=(",", ":"))
        return headers, body.encode()
    headers["Content-Type"] = "application/xml"
    body = f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{detail}</Message></Error>'
    return headers, body.encode()
