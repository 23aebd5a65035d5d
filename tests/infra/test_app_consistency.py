"""The templates provision what the app uses: what its bindings name, what core/names.py
lists, and every app setting its Settings class needs. No Azure needed."""

from __future__ import annotations

import re

import pytest

from core import names
from adapters.settings import Settings
from tests.infra import bicep
from tests.infra.conftest import DEPLOY_PARAMS, MAIN, app_settings_of, names_of

SB_QUEUE = "Microsoft.ServiceBus/namespaces/queues"
STORAGE_QUEUE = "Microsoft.Storage/storageAccounts/queueServices/queues"
TABLE = "Microsoft.Storage/storageAccounts/tableServices/tables"

#: Binding type -> (resource type its queueName/tableName names, default connection).
BINDING_KINDS = {
    "serviceBusTrigger": (SB_QUEUE, "AzureWebJobsServiceBus"),
    "serviceBus": (SB_QUEUE, "AzureWebJobsServiceBus"),
    "queueTrigger": (STORAGE_QUEUE, "AzureWebJobsStorage"),
    "queue": (STORAGE_QUEUE, "AzureWebJobsStorage"),
    "table": (TABLE, "AzureWebJobsStorage"),
    "timerTrigger": (None, None),
    "httpTrigger": (None, None),  # nothing to provision
    "http": (None, None),
}
#: Which identity-based setting locates the service, per resource kind.
LOCATOR = {SB_QUEUE: "fullyQualifiedNamespace", STORAGE_QUEUE: "accountName", TABLE: "accountName"}

_SETTING_REF = re.compile(r"^%([^%]+)%$")


def resolve(value: str, deployed_settings: dict) -> str:
    """A binding value as the host resolves it: ``%NAME%`` is the app setting NAME."""
    match = _SETTING_REF.match(value)
    if not match:
        return value
    setting = match.group(1)
    assert setting in deployed_settings, f"%{setting}% is used by a binding but no app setting {setting} is set"
    resolved = deployed_settings[setting]
    assert isinstance(resolved, str), f"app setting {setting} is not a known string: {resolved}"
    return resolved


def assert_identity_connection(connection: str, resource_type: str, deployed_settings: dict) -> None:
    assert connection not in deployed_settings, (
        f"{connection} is set as a connection string; Azure uses the identity-based {connection}__* form"
    )
    locator = f"{connection}__{LOCATOR[resource_type]}"
    assert locator in deployed_settings, f"connection {connection}: no {locator} app setting"
    assert deployed_settings.get(f"{connection}__credential") == "managedidentity", f"{connection}__credential"
    assert f"{connection}__clientId" in deployed_settings, f"{connection}__clientId (user-assigned identity)"


# --- function_app.py ---------------------------------------------------------------------


def test_function_app_has_functions(function_bindings):
    assert function_bindings, "function_app.py registers no function"


def test_every_binding_is_provisioned(function_bindings, deployment, deployed_settings):
    checked = []
    for function, bindings in function_bindings.items():
        for binding in bindings:
            kind = binding["type"]
            assert kind in BINDING_KINDS, f"{function}: binding type {kind} is not covered by the infra tests"
            resource_type, default_connection = BINDING_KINDS[kind]
            # Every %SETTING% anywhere in the binding must be an app setting.
            for key, value in binding.items():
                for setting in re.findall(r"%([^%]+)%", value) if isinstance(value, str) else ():
                    assert setting in deployed_settings, f"{function}.{key}: %{setting}% is not an app setting"
            if resource_type is None:
                continue
            assert "topicName" not in binding, f"{function}: topics are not provisioned"
            target = resolve(binding.get("tableName") or binding["queueName"], deployed_settings)
            provisioned = names_of(deployment, resource_type)
            assert target in provisioned, f"{function}: {kind} uses {target!r}, not in {sorted(provisioned)}"
            if kind == "queueTrigger":
                poison = target + names.POISON_SUFFIX
                assert poison in provisioned, f"{function}: no poison queue {poison!r}"
            connection = binding.get("connection") or default_connection
            assert_identity_connection(connection, resource_type, deployed_settings)
            checked.append((function, kind, target))
    assert checked, "no binding named a queue or a table"


def test_timer_schedules_resolve_to_ncrontab_with_seconds(function_bindings, deployed_settings):
    schedules = [b["schedule"] for bs in function_bindings.values() for b in bs if b["type"] == "timerTrigger"]
    for schedule in schedules:
        value = resolve(schedule, deployed_settings)
        assert len(value.split()) == 6, f"timer schedule {value!r} is not six-field NCRONTAB"


# --- core/names.py -------------------------------------------------------------------------


def test_service_bus_queues_match_core_names(deployment):
    provisioned = {q.name: q for q in deployment.of_type(SB_QUEUE)}
    assert set(provisioned) == {spec.name for spec in names.SERVICEBUS_QUEUES}
    for spec in names.SERVICEBUS_QUEUES:
        props = provisioned[spec.name].properties
        assert bicep.iso_duration(props["lockDuration"]) == spec.lock_duration, spec.name
        assert props["maxDeliveryCount"] == spec.max_delivery_count, spec.name
        assert bicep.iso_duration(props["defaultMessageTimeToLive"]) == spec.default_ttl, spec.name
        assert props["deadLetteringOnMessageExpiration"] is spec.dead_letter_on_expiry, spec.name
        assert props["requiresDuplicateDetection"] is spec.duplicate_detection, spec.name
        if spec.duplicate_detection:
            window = bicep.iso_duration(props["duplicateDetectionHistoryTimeWindow"])
            assert window == spec.duplicate_detection_window, spec.name
        assert not props.get("requiresSession"), f"{spec.name}: the app does not use sessions"


def test_storage_queues_and_poison_queues_match_core_names(deployment):
    expected = {name for name, _ in names.STORAGE_QUEUES}
    expected |= {name + names.POISON_SUFFIX for name, _ in names.STORAGE_QUEUES}
    assert names_of(deployment, STORAGE_QUEUE) == expected


def test_tables_match_core_names(deployment):
    assert names_of(deployment, TABLE) == {name for name, _ in names.TABLES}


def test_name_settings_point_at_the_provisioned_names(deployed_settings):
    assert {k: deployed_settings.get(k) for k in names.NAME_SETTINGS} == names.NAME_SETTINGS


def test_both_connections_are_identity_based(deployed_settings):
    assert_identity_connection(names.SERVICEBUS_CONNECTION, SB_QUEUE, deployed_settings)
    assert_identity_connection(names.STORAGE_CONNECTION, TABLE, deployed_settings)


# --- core/settings.py ---------------------------------------------------------------------


def aliases(field) -> list[str]:
    alias = field.validation_alias
    return list(getattr(alias, "choices", None) or [alias])


def test_every_required_setting_is_set(deployed_settings):
    required = {name: aliases(f) for name, f in Settings.model_fields.items() if f.is_required()}
    assert required, "Settings has no required field: this test would check nothing"
    for field, field_aliases in required.items():
        assert any(a in deployed_settings for a in field_aliases), f"Settings.{field}: none of {field_aliases} is set"


def test_settings_validate_from_the_deployed_app_settings(deployed_settings, monkeypatch):
    """Build Settings from exactly what the Bicep sets (deploy-time values as placeholders)."""
    for field in Settings.model_fields.values():
        for alias in aliases(field):
            monkeypatch.delenv(alias, raising=False)
    for key, value in deployed_settings.items():
        monkeypatch.setenv(key, value if isinstance(value, str) else f"placeholder-for-{key}")
    settings = Settings()
    assert settings.storage_connection_string is None and settings.servicebus_connection_string is None
    assert settings.storage_client_id and settings.servicebus_client_id
    assert settings.orders_queue == names.ORDERS_QUEUE
    assert settings.scheduler_queue == names.SCHEDULER_QUEUE
    assert settings.supervisor_schedule == names.DEFAULT_SUPERVISOR_SCHEDULE
    assert (settings.step_timeout_seconds, settings.pending_timeout_seconds, settings.max_failures) == (30, 30, 3)


#: App setting -> (main.bicep parameter, a value to pass, what the setting must become).
TUNING = {
    "REMOTE_SERVICE_URL": ("remoteServiceUrl", "https://other.example.test", "https://other.example.test"),
    "STEP_TIMEOUT_SECONDS": ("stepTimeoutSeconds", 41, "41"),
    "PENDING_TIMEOUT_SECONDS": ("pendingTimeoutSeconds", 43, "43"),
    "MAX_FAILURES": ("maxFailures", 7, "7"),
    "SUPERVISOR_SCHEDULE": ("supervisorSchedule", "*/30 * * * * *", "*/30 * * * * *"),
}


@pytest.mark.parametrize("setting", sorted(TUNING))
def test_tuning_values_come_from_parameters(setting):
    parameter, value, expected = TUNING[setting]
    assert _field_for(setting), f"{setting} is not read by Settings"
    deployed = app_settings_of(bicep.evaluate(MAIN, {**DEPLOY_PARAMS, parameter: value}))
    assert deployed[setting] == expected


def _field_for(setting: str) -> str | None:
    for name, field in Settings.model_fields.items():
        if setting in aliases(field):
            return name
    return None
