"""One MessageId rule for order messages, stated the same everywhere and computed by one
function (``core.models.message_id_for``): docs/clients.md, "Sending orders" (its table and
its ten-line client, whose hashing lines are run here), the published schema, docs/,
``ordersctl send-order`` and the senders of the demo, the soak and the benchmarks."""

from __future__ import annotations

import json
import re

from core.models import MESSAGE_ID_RULE, OrderRequest, message_id_for
from devtools.orders import bad_order_message, load_bad_orders, order_message
from tests import ROOT
from tests.infra.markdown import section

#: How the old rule was worded: a client that follows it has a corrected resend dropped.
STALE = re.compile(
    r"order id as (the )?(message's )?MessageId|use it as the message's MessageId"
    r"|MessageId (to|=|is) the order id(?! \+)|also the message id",
    re.IGNORECASE,
)


#: Where the clients' contract lives: the orders queue's, the events' and the cancels'.
CLIENTS = ROOT / "docs" / "clients.md"


def _sending_orders() -> str:
    return section(CLIENTS, "Sending orders from any Service Bus client")


def _client_hashing() -> dict:
    """The page's plain-SDK client, run up to (not including) the Service Bus calls."""
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", _sending_orders(), re.DOTALL)
               if "\nwith ServiceBusClient" in block]
    hashing = code.split("\nwith ServiceBusClient")[0]
    hashing = "\n".join(line for line in hashing.splitlines() if not line.startswith("from azure"))
    namespace: dict = {}
    exec(compile(hashing, "docs/clients.md (Sending orders)", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


def test_the_documented_client_computes_what_message_id_for_computes():
    client = _client_hashing()
    assert client["message_id"] == message_id_for(client["order"]["order_id"], client["body"].encode())


def test_the_contract_table_states_the_rule_and_its_example_is_the_client_s_message_id():
    (row,) = [line for line in _sending_orders().splitlines() if line.startswith("| `MessageId` |")]
    assert MESSAGE_ID_RULE in row
    (example,) = re.findall(r"e\.g\. `([^`]+)`", row)
    assert example == _client_hashing()["message_id"]


def test_the_published_schema_states_the_same_rule():
    schema = json.loads((ROOT / "schemas" / "order.schema.json").read_text(encoding="utf-8"))
    assert MESSAGE_ID_RULE in schema["properties"]["order_id"]["description"]


def test_docs_and_the_cli_state_the_same_rule_and_none_states_the_old_one():
    deploy = " ".join((ROOT / "docs" / "deploy.md").read_text(encoding="utf-8").split())
    assert MESSAGE_ID_RULE in deploy
    from ordersctl.cli import send_order

    assert MESSAGE_ID_RULE in " ".join((send_order.__doc__ or "").split())
    texts = [ROOT / "README.md", ROOT / "schemas" / "order.schema.json", ROOT / "ordersctl" / "cli.py",
             *sorted((ROOT / "docs").glob("*.md"))]
    stale = [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for path in texts
             for m in STALE.finditer(" ".join(path.read_text(encoding="utf-8").split()))]
    assert not stale, stale


def test_every_sender_of_orders_uses_the_rule():
    def body(message) -> bytes:
        return b"".join(message.body)

    order = OrderRequest.model_validate_json(body(order_message("o-1", 3)))
    assert order.message_id() == message_id_for("o-1", order.document().encode())  # ordersctl send-order
    valid = order_message("demo-000001", 1)  # the demo, the soak, the benchmarks
    assert valid.message_id == message_id_for("demo-000001", body(valid))
    case = load_bad_orders()[0]  # the demo's invalid messages
    bad = bad_order_message(case, "bad-7")
    assert bad.message_id == message_id_for("bad-7", body(bad))
