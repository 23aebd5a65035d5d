"""The committed JSON Schema is the model's, and agrees with it on valid and invalid
orders: in Python (jsonschema) and as a JavaScript client reads it (Ajv, ECMA-262
regular expressions, where ``$`` does not match before a final newline and ``\\d`` is
ASCII only)."""

import json
import shutil
import subprocess

import jsonschema
import pytest
from pydantic import ValidationError

from core.models import OrderRequest
from core.schema import SCHEMA_PATH, render
from devtools.orders import order_dict
from tests import ROOT

AJV = ROOT / "tests" / "unit" / "js" / "validate_schema.mjs"


def test_committed_schema_matches_the_model():
    assert SCHEMA_PATH.read_text(encoding="utf-8") == render(), "run `python -m core.schema` and commit the result"


@pytest.mark.parametrize(
    "body, valid",
    [
        (order_dict("o-1"), True),
        (order_dict("o-1", total=7.5), False),
        (order_dict("o-1", order_id="a/b"), False),
        (order_dict("o-1", unknown="x"), False),
        ({k: v for k, v in order_dict("o-1").items() if k != "items"}, False),
    ],
)
def test_schema_and_model_agree(body, valid):
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    schema_ok = jsonschema.Draft202012Validator(schema).is_valid(body)
    try:
        OrderRequest.model_validate_json(json.dumps(body))
        model_ok = True
    except ValidationError:
        model_ok = False
    assert schema_ok == model_ok == valid


#: Orders whose validity depends on how a pattern is read, with the model's answer.
REGEX_CASES = [
    (order_dict("o-1"), True),
    (order_dict("o-1", currency="EUR\n"), False),  # Python's re: "$" matches before the final newline
    (order_dict("o-1\n"), False),
    (order_dict("o-1", total="\u0667.\u0665\u0660"), False),  # Arabic-Indic digits: not [0-9]
    (order_dict("o-1", total="\uff17.50"), False),  # a fullwidth digit
    (order_dict("o-1", customer_id="c\u00e9"), False),  # a letter outside A-Za-z
    (order_dict("o-1", total="7.50"), True),
]


def _ajv(documents: list, schema_path=SCHEMA_PATH) -> list[bool]:
    node = shutil.which("node")
    assert node, "node is needed to check the schema as JavaScript clients read it (make setup installs Ajv)"
    result = subprocess.run(
        [node, str(AJV), str(schema_path)], input=json.dumps(documents), capture_output=True, text=True,
        cwd=ROOT, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _model_accepts(body: dict) -> bool:
    try:
        OrderRequest.model_validate_json(json.dumps(body))
    except ValidationError:
        return False
    return True


def test_schema_read_with_ecma262_regexes_agrees_with_the_model():
    bodies = [body for body, _ in REGEX_CASES]
    expected = [valid for _, valid in REGEX_CASES]
    assert [_model_accepts(body) for body in bodies] == expected
    assert _ajv(bodies) == expected
