import pytest
from pydantic import ValidationError

from adapters.settings import MissingSetting, Settings

BASE = {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "ServiceBusConnection": "Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=v", "REMOTE_INVENTORY_URL": "http://127.0.0.1:1/inventory"}


def test_defaults_and_names(monkeypatch):
    for key, value in BASE.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.orders_queue == "orders"
    assert settings.step_timeout_seconds == 30.0
    assert settings.max_failures == 3


def test_identity_based_connections_are_enough(monkeypatch):
    monkeypatch.setenv("AzureWebJobsStorage__accountName", "acct")
    monkeypatch.setenv("ServiceBusConnection__fullyQualifiedNamespace", "ns.servicebus.windows.net")
    settings = Settings()
    assert settings.storage_account_name == "acct"
    assert settings.servicebus_namespace == "ns.servicebus.windows.net"


def test_each_remote_service_has_its_url_and_queue_settings(monkeypatch):
    for key, value in BASE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PAYMENTS_REQUESTS_QUEUE", "pay-in")
    settings = Settings(REMOTE_SHIPPING_URL="https://ship.example/api")
    assert settings.remote_url("inventory") == "http://127.0.0.1:1/inventory"
    assert settings.remote_url("shipping") == "https://ship.example/api"
    assert settings.requests_queues == {"inventory": "inventory-requests", "payments": "pay-in", "shipping": "shipping-requests"}


def test_a_missing_remote_url_names_its_setting(monkeypatch):
    for key, value in BASE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("REMOTE_PAYMENTS_URL", raising=False)
    with pytest.raises(MissingSetting, match="REMOTE_PAYMENTS_URL"):
        Settings().remote_url("payments")


def test_step_defaults_come_from_the_app_settings(monkeypatch):
    for key, value in BASE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("STEP_TIMEOUT_SECONDS", "12")
    monkeypatch.setenv("AGENT_MAX_CALLS", "4")
    defaults = Settings().step_defaults()
    assert (defaults.timeout_seconds, defaults.max_failures, defaults.agent_max_calls) == (12.0, 3, 4)


@pytest.mark.parametrize("name", ["STEP_TIMEOUT_SECONDS", "AGENT_BACKOFF_INITIAL_SECONDS", "AGENT_BACKOFF_MAX_SECONDS"])
@pytest.mark.parametrize("value", ["0", "-5", "1e12", "inf"])
def test_a_step_setting_no_step_can_run_with_is_refused_naming_it(monkeypatch, name, value):
    """As a workflow's own StepPolicy is (core/workflow.py): refused when read, not when an
    order's claim meets it."""
    for key, base in BASE.items():
        monkeypatch.setenv(key, base)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name):
        Settings()


def test_missing_connection_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("ServiceBusConnection", BASE["ServiceBusConnection"])
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    with pytest.raises(ValidationError, match="no storage connection"):
        Settings()


def test_empty_values_are_ignored(monkeypatch):
    for key, value in BASE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("STEP_TIMEOUT_SECONDS", "")
    assert Settings().step_timeout_seconds == 30.0


def test_the_approval_timeout_is_positive_seconds_and_is_the_waiting_steps_default_deadline(monkeypatch):
    from supervisor.supervision import policy_from

    for key, value in BASE.items():
        monkeypatch.setenv(key, value)
    assert Settings().approval_timeout_seconds == 24 * 60 * 60  # a day unless set
    monkeypatch.setenv("APPROVAL_TIMEOUT_SECONDS", "4.5")
    settings = Settings()
    assert settings.step_defaults().wait_timeout_seconds == 4.5
    # Shorter than STEP_TIMEOUT_SECONDS (30): the sweep looks at orders indexed 4.5 s ago.
    assert policy_from(settings).shortest_timeout.total_seconds() == 4.5
    for bad in ("0", "-3", "soon", str(366 * 24 * 60 * 60)):
        monkeypatch.setenv("APPROVAL_TIMEOUT_SECONDS", bad)
        with pytest.raises(ValidationError, match="APPROVAL_TIMEOUT_SECONDS"):
            Settings()
