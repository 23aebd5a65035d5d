import pytest
from pydantic import ValidationError

from adapters.settings import Settings

BASE = {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "ServiceBusConnection": "Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=v", "REMOTE_SERVICE_URL": "http://127.0.0.1:1"}


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
    monkeypatch.setenv("REMOTE_SERVICE_URL", "https://remote.example")
    settings = Settings()
    assert settings.storage_account_name == "acct"
    assert settings.servicebus_namespace == "ns.servicebus.windows.net"


def test_missing_required_setting_names_it(monkeypatch):
    monkeypatch.setenv("AzureWebJobsStorage", "UseDevelopmentStorage=true")
    monkeypatch.setenv("ServiceBusConnection", BASE["ServiceBusConnection"])
    monkeypatch.delenv("REMOTE_SERVICE_URL", raising=False)
    with pytest.raises(ValidationError, match="REMOTE_SERVICE_URL"):
        Settings()


def test_missing_connection_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("REMOTE_SERVICE_URL", "http://x")
    monkeypatch.setenv("ServiceBusConnection", BASE["ServiceBusConnection"])
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    with pytest.raises(ValidationError, match="no storage connection"):
        Settings()


def test_empty_values_are_ignored(monkeypatch):
    for key, value in BASE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("STEP_TIMEOUT_SECONDS", "")
    assert Settings().step_timeout_seconds == 30.0
