"""Retention as deployed: the archive container, the app's role on it alone, the settings
the app reads (identity-based archive connection, RETENTION_* from parameters), and no
test-only fault switch in Azure. No Azure needed."""

from __future__ import annotations

import os

import pytest

from adapters import clients
from adapters.archive import READ_CHUNK
from adapters.settings import Settings
from core import names
from tests.infra import bicep
from tests.infra.conftest import DEPLOY_PARAMS, MAIN, app_settings_of, names_of
from tests.infra.test_roles import ARCHIVE_CONTAINER, assignments

CONTAINER = "Microsoft.Storage/storageAccounts/blobServices/containers"


def test_the_archive_container_is_provisioned_under_its_name(deployment, deployed_settings):
    assert names.ARCHIVE_CONTAINER in names_of(deployment, CONTAINER)
    assert deployed_settings[names.ARCHIVE_CONTAINER_SETTING] == names.ARCHIVE_CONTAINER
    (container,) = [c for c in deployment.of_type(CONTAINER) if c.name == names.ARCHIVE_CONTAINER]
    assert container.properties["publicAccess"] == "None"


def test_the_app_may_write_the_archive_container_and_that_container_only(deployment):
    granted = [
        (role, scope, ra) for role, scope, _, ra in assignments(deployment) if role == "Storage Blob Data Contributor"
    ]
    assert [scope for _, scope, _ in granted] == [ARCHIVE_CONTAINER]
    (_, _, ra) = granted[0]
    assert ra.body["scope"].symbol == "archiveContainer"


def test_the_archive_is_reached_by_identity_and_the_settings_validate(deployed_settings, monkeypatch):
    connection = names.ARCHIVE_STORAGE_CONNECTION
    assert connection not in deployed_settings, "a connection string: Azure uses the identity-based form"
    assert f"{connection}__blobServiceUri" in deployed_settings
    assert deployed_settings[f"{connection}__credential"] == "managedidentity"
    assert f"{connection}__clientId" in deployed_settings
    assert names.RETENTION_FAULT_SETTING not in deployed_settings  # a local test switch, never in Azure
    for key in list(os.environ):
        if key.startswith(("AzureWebJobs", "ServiceBus", "StateStorage", "ArchiveStorage", "RETENTION", "ARCHIVE")):
            monkeypatch.delenv(key)
    for key, value in deployed_settings.items():
        monkeypatch.setenv(key, value if isinstance(value, str) else f"placeholder-{key.lower().replace('_', '-')}")
    settings = Settings()
    assert (settings.retention_days, settings.retention_include_error, settings.retention_max_orders) == (
        names.DEFAULT_RETENTION_DAYS, False, names.DEFAULT_RETENTION_MAX_ORDERS,
    )
    assert settings.retention_schedule == names.DEFAULT_RETENTION_SCHEDULE and settings.retention_fault is None
    container = clients.archive_container(settings)
    assert container.container_name == names.ARCHIVE_CONTAINER
    # A day is read back in chunks of READ_CHUNK, the first request too (the SDK's default: 32 MiB).
    assert (container._config.max_single_get_size, container._config.max_chunk_get_size) == (READ_CHUNK, READ_CHUNK)


#: App setting -> (main.bicep parameter, a value to pass, what the setting must become).
RETENTION = {
    names.RETENTION_DAYS_SETTING: ("retentionDays", 90, "90"),
    names.RETENTION_INCLUDE_ERROR_SETTING: ("retentionIncludeError", True, "true"),
    names.RETENTION_MAX_ORDERS_SETTING: ("retentionMaxOrdersPerTick", 20000, "20000"),
    names.RETENTION_SCHEDULE_SETTING: ("retentionSchedule", "0 */5 * * * *", "0 */5 * * * *"),
}


@pytest.mark.parametrize("setting", sorted(RETENTION))
def test_retention_comes_from_parameters(setting):
    parameter, value, expected = RETENTION[setting]
    deployed = app_settings_of(bicep.evaluate(MAIN, {**DEPLOY_PARAMS, parameter: value}))
    assert deployed[setting] == expected
