"""The committed JSON Schema is the model's, and agrees with it on valid and invalid orders."""

import json

import jsonschema
import pytest
from pydantic import ValidationError

from core.models import OrderRequest
from core.schema import SCHEMA_PATH, render
from devtools.orders import order_dict


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
