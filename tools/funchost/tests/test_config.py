"""local.settings.json, host.json (with app-setting overrides) and %SETTING% resolution."""

from __future__ import annotations

import json
import logging
import os
from datetime import timedelta

import pytest

from tools.funchost.config import (
    ConfigError,
    apply_settings,
    host_options,
    read_host_json,
    read_local_settings,
    resolve,
)


def test_local_settings_values_become_settings_but_existing_ones_win(tmp_path):
    path = tmp_path / "local.settings.json"
    path.write_text(json.dumps({"IsEncrypted": False, "Values": {"A": "from-file", "B": "from-file", "N": 3}}))
    environ = {"A": "from-env"}

    applied = apply_settings(read_local_settings(path), environ)

    assert environ == {"A": "from-env", "B": "from-file", "N": "3"}
    assert sorted(applied) == ["B", "N"]


def test_missing_local_settings_is_empty_and_encrypted_or_broken_is_an_error(tmp_path):
    assert read_local_settings(tmp_path / "absent.json") == {}
    encrypted = tmp_path / "encrypted.json"
    encrypted.write_text('{"IsEncrypted": true, "Values": {}}')
    with pytest.raises(ConfigError, match="encrypted"):
        read_local_settings(encrypted)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_local_settings(broken)


def test_percent_settings_resolve_and_a_missing_one_is_named():
    environ = {"QUEUE": "orders", "ENV": "dev"}
    assert resolve("%QUEUE%", environ) == "orders"
    assert resolve("%QUEUE%-%ENV%", environ) == "orders-dev"
    assert resolve("plain", environ) == "plain"
    assert resolve(True, environ) is True
    with pytest.raises(ConfigError, match="'%MISSING%' does not resolve"):
        resolve("%MISSING%", environ)


def test_host_json_defaults_when_absent(tmp_path):
    options = host_options(read_host_json(tmp_path / "host.json", {}))
    assert options.queues.batch_size == 16
    assert options.queues.new_batch_threshold == 8 * (os.cpu_count() or 1)  # Azure's batchSize / 2 per vCPU
    assert options.queues.max_dequeue_count == 5
    assert options.queues.visibility_timeout == timedelta(0)
    assert options.queues.max_polling_interval == timedelta(minutes=1)
    assert options.queues.message_encoding == "base64"
    assert options.service_bus.auto_complete_messages is True
    assert options.service_bus.max_auto_lock_renewal_duration == timedelta(minutes=5)


def test_host_json_values_and_app_setting_overrides(tmp_path):
    path = tmp_path / "host.json"
    path.write_text(
        json.dumps(
            {
                "logging": {"logLevel": {"default": "Warning"}},
                "extensions": {
                    "queues": {"maxPollingInterval": "00:00:02", "batchSize": 8, "messageEncoding": "none"},
                    "serviceBus": {"maxConcurrentCalls": 16, "prefetchCount": 0},
                },
            }
        )
    )
    environ = {
        "AzureFunctionsJobHost__extensions__queues__batchSize": "4",
        "AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls": "2",
        "AzureFunctionsJobHost__extensions__queues__maxDequeueCount": "1",
    }
    options = host_options(read_host_json(path, environ))
    assert options.queues.batch_size == 4
    assert options.queues.max_dequeue_count == 1
    assert options.queues.max_polling_interval == timedelta(seconds=2)
    assert options.queues.message_encoding == "none"
    assert options.service_bus.max_concurrent_calls == 2
    assert options.log_level == logging.WARNING


def test_a_full_azure_host_json_is_understood_and_what_the_host_does_not_use_is_ignored(tmp_path):
    path = tmp_path / "host.json"
    path.write_text(
        json.dumps(
            {
                "version": "2.0",
                "logging": {
                    "applicationInsights": {
                        "samplingSettings": {"isEnabled": True, "excludedTypes": "Request;Exception"}
                    },
                    "logLevel": {"default": "Information", "Host.Results": "Information", "Function": "Information"},
                },
                "extensionBundle": {"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[4.*, 5.0.0)"},
                "functionTimeout": "00:10:00",
                "extensions": {
                    "queues": {"visibilityTimeout": "00:00:05", "maxDequeueCount": 5},
                    "serviceBus": {"prefetchCount": 0, "maxAutoLockRenewalDuration": "00:05:00"},
                },
            }
        )
    )
    options = host_options(read_host_json(path, {}))
    assert options.queues.visibility_timeout == timedelta(seconds=5)
    assert options.queues.max_dequeue_count == 5
    assert options.service_bus.max_auto_lock_renewal_duration == timedelta(minutes=5)
    assert options.log_level == logging.INFO


@pytest.mark.parametrize(
    "queues",
    [{"batchSize": 64}, {"messageEncoding": "utf16"}, {"visibilityTimeout": "5 seconds"}, {"maxDequeueCount": "x"}],
)
def test_invalid_host_json_values_are_errors(queues):
    with pytest.raises(ConfigError):
        host_options({"extensions": {"queues": queues}})
