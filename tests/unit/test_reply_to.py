"""A queue name compared as the broker resolves it (core.models.queue_key): the ReplyTo
check (scheduler/submission.py) and the agents' reply (agents/blueprint.py) use it."""

from __future__ import annotations

import pytest

from core.models import queue_key


@pytest.mark.parametrize(
    "spelling",
    ["alerts", "ALERTS", "Alerts", "alerts/", "/alerts", "//alerts//", " alerts ", "alerts/$DeadLetterQueue",
     "alerts/$deadletterqueue", "alerts/$Transfer/$DeadLetterQueue", "sb://ns.servicebus.windows.net/alerts",
     "amqps://ns.servicebus.windows.net/Alerts/", "ns.servicebus.windows.net/alerts", "127.0.0.1:5672/alerts"],
)
def test_every_spelling_the_broker_resolves_to_a_queue_is_that_queue(spelling):
    assert queue_key(spelling) == "alerts"


@pytest.mark.parametrize("other", ["alerts2", "my-alerts", "team/alerts", "alerts.v2", "sb://ns.servicebus.windows.net"])
def test_other_queues_stay_other(other):
    assert queue_key(other) != "alerts"
