"""The order-events queue (events for waiting steps, from any client) is tied across
core/names.py, the Bicep, the docs and the message model: provisioned with duplicate
detection like the orders queue, named as the scope of a client's Data Sender role in
docs/deploy.md, its MessageId rule stated in docs/clients.md ("Sending order events") as
core.models computes it."""

from __future__ import annotations

import hashlib
import re

from core import names
from core.models import EVENT_MESSAGE_ID_RULE, OrderEvent
from tests import ROOT
from tests.infra.markdown import section
from tests.infra.test_app_consistency import SB_QUEUE

DATA_SENDER = "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39"


def test_the_queue_is_provisioned_with_duplicate_detection_like_the_orders_queue(deployment):
    (spec,) = [q for q in names.SERVICEBUS_QUEUES if q.name == names.ORDER_EVENTS_QUEUE]
    (orders,) = [q for q in names.SERVICEBUS_QUEUES if q.name == names.ORDERS_QUEUE]
    assert (spec.duplicate_detection, spec.dead_letter_on_expiry) == (True, True)
    assert spec.duplicate_detection_window == orders.duplicate_detection_window
    (queue,) = [q for q in deployment.of_type(SB_QUEUE) if q.name == names.ORDER_EVENTS_QUEUE]
    assert queue.properties["requiresDuplicateDetection"] is True


def test_deploy_docs_scope_a_clients_data_sender_role_to_that_queue():
    deploy = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    (command,) = re.findall(r"az role assignment create[^\n]*\\\n[^\n]*queues/[a-z-]+\"", deploy)
    assert DATA_SENDER in command and command.endswith(f'/queues/{names.ORDER_EVENTS_QUEUE}"')


def test_the_clients_page_states_the_message_id_rule_that_the_model_computes():
    page = " ".join(section(ROOT / "docs" / "clients.md", "Sending order events from any Service Bus client").split())
    assert EVENT_MESSAGE_ID_RULE in page
    event = OrderEvent(order_id="o-7", name="approval", approved=False, by="bob", note="no")
    body = event.model_dump_json(exclude_none=True).encode()
    assert event.message_id() == f"o-7:approval:{hashlib.sha256(body).hexdigest()[:16]}"
