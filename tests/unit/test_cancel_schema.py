"""The committed cancel message schema (schemas/cancel.schema.json) is CancelRequest's,
and agrees with it on valid and invalid bodies, in Python (jsonschema) and as a
JavaScript client reads it (Ajv)."""

import json

import jsonschema
import pytest
from pydantic import ValidationError

from core.models import CANCEL_REASON_MAX_CHARS, CancelRequest
from core.schema import CANCEL_SCHEMA_PATH, render
from tests.unit.test_schema import _ajv

CASES = [
    ({"order_id": "o-1"}, True),
    ({"order_id": "o-1", "reason": "customer called"}, True),
    ({"order_id": "o-1", "reason": None}, True),
    ({"order_id": "o-1", "reason": ""}, False),
    ({"order_id": "o-1", "reason": "a\u0007b"}, False),
    ({"order_id": "o-1", "reason": "a\u0085b"}, False),
    ({"order_id": "o-1", "reason": "x" * (CANCEL_REASON_MAX_CHARS + 1)}, False),
    ({"order_id": "o-1", "reason": 5}, False),
    ({"order_id": "a/b"}, False),
    ({"reason": "x"}, False),
    ({"order_id": "o-1", "by": "me"}, False),
]


#: Python's re lets "$" match before a final newline (JSON Schema's ECMA-262 does not): Ajv only.
ECMA_CASES = [*CASES, ({"order_id": "o-1\n"}, False)]


def test_committed_cancel_schema_matches_the_model():
    assert CANCEL_SCHEMA_PATH.read_text(encoding="utf-8") == render(CancelRequest, CANCEL_SCHEMA_PATH), (
        "run `python -m core.schema` and commit the result"
    )


def _model_accepts(body: dict) -> bool:
    try:
        CancelRequest.model_validate_json(json.dumps(body))
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(("body", "valid"), CASES)
def test_cancel_schema_and_model_agree(body, valid):
    schema = json.loads(CANCEL_SCHEMA_PATH.read_text(encoding="utf-8"))
    assert jsonschema.Draft202012Validator(schema).is_valid(body) == _model_accepts(body) == valid


def test_cancel_schema_read_with_ecma262_regexes_agrees_with_the_model():
    assert [_model_accepts(body) for body, _ in ECMA_CASES] == [valid for _, valid in ECMA_CASES]
    assert _ajv([body for body, _ in ECMA_CASES], CANCEL_SCHEMA_PATH) == [valid for _, valid in ECMA_CASES]
