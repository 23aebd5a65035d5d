"""The odd-HTTP corpus of the status API (``odd_http.json``), read as plain values:
strings, header values and bodies ready for an HTTP client (tests/integration/test_api.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

ODD_HTTP = Path(__file__).resolve().parent / "odd_http.json"


def load_odd_http() -> dict[str, Any]:
    return json.loads(ODD_HTTP.read_text(encoding="utf-8"))


def text(spec: Any) -> Any:
    """A value of the corpus: a string as is, ``{prefix, repeat, count}`` spelled out."""
    if isinstance(spec, dict) and "repeat" in spec:
        return spec.get("prefix", "") + spec["repeat"] * spec["count"]
    return spec


def principal_header(spec: dict[str, Any]) -> str:
    """An ``X-MS-CLIENT-PRINCIPAL`` value: ``raw`` as is, else base64 of ``b64_text``
    (UTF-8), of ``b64_hex`` (bytes) or of ``b64_json`` (a JSON document)."""
    if "raw" in spec:
        return text(spec["raw"])
    if "b64_hex" in spec:
        data = bytes.fromhex(spec["b64_hex"])
    elif "b64_json" in spec:
        data = json.dumps(spec["b64_json"]).encode()
    else:
        data = text(spec["b64_text"]).encode()
    return base64.b64encode(data).decode()


def body(spec: Any) -> bytes | None:
    """A request body (Latin-1 bytes, so any byte value can be written), or None."""
    return None if spec is None else text(spec).encode("latin-1")
