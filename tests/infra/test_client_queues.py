"""The queues any client may send to (core/names.py CLIENT_QUEUES: orders, order-cancellations):
each is provisioned with duplicate detection (the MessageId rule of its message), read by a
function of the app, and docs/deploy.md scopes a client's Data Sender role to each of them
alone, never to the namespace."""

from __future__ import annotations

import json
import re

from core import names
from core.models import CANCEL_MESSAGE_ID_RULE, cancel_message_id
from core.schema import CANCEL_SCHEMA_PATH
from tests import ROOT
from tests.infra.markdown import section

DEPLOY = ROOT / "docs" / "deploy.md"


def test_every_client_queue_has_duplicate_detection():
    specs = {spec.name: spec for spec in names.SERVICEBUS_QUEUES}
    for queue in names.CLIENT_QUEUES:
        assert specs[queue].duplicate_detection, queue
        assert specs[queue].duplicate_detection_window.days == 1, queue


def test_every_client_queue_is_read_by_a_function(function_bindings):
    read = {
        binding.get("queueName") for bindings in function_bindings.values() for binding in bindings
        if binding.get("type") == "serviceBusTrigger"
    }
    for queue in names.CLIENT_QUEUES:
        spec = next(s for s in names.SERVICEBUS_QUEUES if s.name == queue)
        assert f"%{spec.setting}%" in read, queue


def test_deploy_docs_scope_the_clients_sender_role_to_each_client_queue():
    text = DEPLOY.read_text(encoding="utf-8")
    loop = re.search(r"for QUEUE in ([^;]+); do\s+az role assignment create (.+?)done", text, re.S)
    assert loop, "docs/deploy.md: the client's role assignment loop is gone"
    assert loop[1].split() == list(names.CLIENT_QUEUES)
    assert '--role "Azure Service Bus Data Sender"' in loop[2] and '--scope "$NS_ID/queues/$QUEUE"' in loop[2]


def test_the_cancel_message_id_rule_is_stated_once_and_as_the_code_computes_it():
    text = section(ROOT / "docs" / "clients.md", "Cancelling an order from any Service Bus client")
    assert f"`{CANCEL_MESSAGE_ID_RULE}`" in text
    assert f"`{cancel_message_id('o-1002')}`" in text and 'message_id="cancel:o-1002"' in text
    schema = json.loads(CANCEL_SCHEMA_PATH.read_text(encoding="utf-8"))
    assert CANCEL_MESSAGE_ID_RULE in schema["properties"]["order_id"]["description"]
