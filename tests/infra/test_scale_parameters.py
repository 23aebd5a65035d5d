"""The deployment's shape (docs/scale.md): the Service Bus tier, a storage account of its
own for the order state, per-instance Service Bus concurrency and the active index's shard
count are parameters of main.bicep, each reaching the resource or app setting it governs.
No Azure needed: the templates are evaluated offline (tests/infra/bicep.py)."""

from __future__ import annotations

import json

import pytest

from adapters.settings import Settings
from core import names
from tests.infra import bicep
from tests.infra.conftest import DEPLOY_PARAMS, MAIN, ROOT, app_settings_of
from tests.infra.test_app_consistency import TABLE, assert_identity_connection
from tests.infra.test_roles import assignments

NAMESPACE = "Microsoft.ServiceBus/namespaces"
SB_QUEUE = "Microsoft.ServiceBus/namespaces/queues"
ACCOUNT = "Microsoft.Storage/storageAccounts"
#: host.json's per-trigger Service Bus concurrency, overridden by this app setting.
MAX_CONCURRENT_CALLS = "AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls"


def deploy(**params) -> bicep.Deployment:
    return bicep.evaluate(MAIN, {**DEPLOY_PARAMS, **params})


def decorators(name: str) -> str:
    """The decorators above ``param <name>`` in main.bicep, on one line."""
    lines = MAIN.read_text().splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith(f"param {name} ")]
    start = at
    while start > 0 and not lines[start - 1].startswith(("param ", "//")) and lines[start - 1].strip():
        start -= 1
    return " ".join(" ".join(lines[start:at]).split())


def test_by_default_one_standard_namespace_with_unpartitioned_queues(deployment):
    (namespace,) = deployment.of_type(NAMESPACE)
    assert namespace.body["sku"] == {"name": "Standard", "tier": "Standard"}
    assert "premiumMessagingPartitions" not in namespace.properties
    assert all("enablePartitioning" not in q.properties for q in deployment.of_type(SB_QUEUE))


def test_premium_takes_its_messaging_units_and_partitions_and_partitions_every_queue():
    deployed = deploy(serviceBusSku="Premium", serviceBusCapacity=4, serviceBusPartitions=2)
    (namespace,) = deployed.of_type(NAMESPACE)
    assert namespace.body["sku"] == {"name": "Premium", "tier": "Premium", "capacity": 4}
    assert namespace.properties["premiumMessagingPartitions"] == 2
    assert namespace.properties["disableLocalAuth"] is True
    queues = deployed.of_type(SB_QUEUE)
    assert queues and all(q.properties["enablePartitioning"] is True for q in queues)


def test_premium_with_one_partition_leaves_the_queues_unpartitioned():
    deployed = deploy(serviceBusSku="Premium", serviceBusCapacity=1, serviceBusPartitions=1)
    (namespace,) = deployed.of_type(NAMESPACE)
    assert namespace.properties["premiumMessagingPartitions"] == 1
    assert all("enablePartitioning" not in q.properties for q in deployed.of_type(SB_QUEUE))


def test_the_tier_parameters_allow_what_azure_allows():
    # learn.microsoft.com/azure/service-bus-messaging/enable-partitions-premium: 1, 2 or 4
    # partitions; messaging units 1, 2, 4, 8, 16 (times the partitions).
    assert "@allowed([ 'Standard' 'Premium' ])" in decorators("serviceBusSku")
    for name, allowed in (("serviceBusCapacity", "1 2 4 8 16"), ("serviceBusPartitions", "1 2 4")):
        assert f"@allowed([ {allowed} ])" in decorators(name), name


def test_by_default_the_state_tables_are_in_the_hosts_account(deployment, deployed_settings):
    (account,) = deployment.of_type(ACCOUNT)
    assert {t.name for t in deployment.of_type(TABLE)} == {name for name, _ in names.TABLES}
    assert not any(key.startswith(names.STATE_STORAGE_CONNECTION) for key in deployed_settings)


def test_a_separate_state_account_holds_the_tables_and_the_app_reaches_it_by_identity(monkeypatch):
    deployed = deploy(separateStateStorage=True)
    accounts = deployed.of_type(ACCOUNT)
    assert len(accounts) == 2
    for account in accounts:  # both take Entra ID only
        assert account.properties["allowSharedKeyAccess"] is False
        assert account.properties["minimumTlsVersion"] == "TLS1_2"
    # The tables are created in the state account's module deployment, none in the host's.
    (state_module,) = deployed.modules["resources"][0].modules["stateStorage"]
    (host_module,) = deployed.modules["resources"][0].modules["storage"]
    assert {t.name for t in state_module.of_type(TABLE)} == {name for name, _ in names.TABLES}
    assert host_module.of_type(TABLE) == []
    assert state_module.of_type("Microsoft.Storage/storageAccounts/blobServices/containers") == []
    (state,) = state_module.of_type(ACCOUNT)

    settings = app_settings_of(deployed)
    assert_identity_connection(names.STATE_STORAGE_CONNECTION, TABLE, settings)
    assert str(settings[f"{names.STATE_STORAGE_CONNECTION}__accountName"]) == str(state.name)
    # The app's tables role is granted on the state account; the host's account keeps blob
    # (the host's leases, the package) and queue (the scheduler's nudges).
    roles_by_account = {
        "state": {role for role, *_ in assignments(state_module)},
        "host": {role for role, *_ in assignments(host_module)},
    }
    assert roles_by_account == {
        "state": {"Storage Table Data Contributor"},
        # The host's blobs and queues, and the retention archive's container.
        "host": {"Storage Blob Data Owner", "Storage Queue Data Contributor", "Storage Blob Data Contributor"},
    }
    # The app builds its settings from exactly that and points its tables at the state account.
    for key in list(settings):
        monkeypatch.delenv(key, raising=False)
    for key, value in settings.items():
        monkeypatch.setenv(key, value if isinstance(value, str) else f"placeholder-for-{key}")
    built = Settings()
    assert built.state_storage_account_name and built.state_storage_client_id
    assert deployed.outputs["AZURE_STATE_STORAGE_ACCOUNT_NAME"] is not None


def test_service_bus_concurrency_per_instance_overrides_host_json_with_the_same_default(deployed_settings):
    host = json.loads((ROOT / "host.json").read_text())
    default = host["extensions"]["serviceBus"]["maxConcurrentCalls"]
    # The app setting names host.json's own path (AzureFunctionsJobHost__<path>).
    path = MAX_CONCURRENT_CALLS.split("__")[1:]
    node = host
    for key in path:
        node = node[key]
    assert node == default
    assert deployed_settings[MAX_CONCURRENT_CALLS] == str(default)
    assert app_settings_of(deploy(serviceBusMaxConcurrentCalls=64))[MAX_CONCURRENT_CALLS] == "64"


def test_the_shard_count_is_a_parameter_with_the_apps_default_and_bounds(deployed_settings):
    assert deployed_settings[names.ACTIVE_INDEX_SHARDS_SETTING] == str(names.DEFAULT_ACTIVE_INDEX_SHARDS)
    text = decorators("activeIndexShards")
    assert f"@maxValue({names.MAX_ACTIVE_INDEX_SHARDS})" in text and "@minValue(1)" in text
    assert app_settings_of(deploy(activeIndexShards=64))[names.ACTIVE_INDEX_SHARDS_SETTING] == "64"
    field = Settings.model_fields["active_index_shards"]
    assert field.default == names.DEFAULT_ACTIVE_INDEX_SHARDS


@pytest.mark.parametrize(
    "param", ["serviceBusSku", "serviceBusCapacity", "serviceBusPartitions", "separateStateStorage",
              "serviceBusMaxConcurrentCalls", "activeIndexShards", "maximumInstanceCount", "instanceMemoryMB"],
)
def test_each_scale_parameter_is_explained_in_docs_scale(param):
    scale = (ROOT / "docs" / "scale.md").read_text()
    assert f"`{param}`" in scale, f"docs/scale.md does not explain {param}"


def test_several_state_accounts_each_hold_the_tables_and_the_app_lists_them_in_order(monkeypatch):
    deployed = deploy(stateStorageAccounts=3)
    resources = deployed.modules["resources"][0]
    state_modules = resources.modules["stateStorage"]
    assert len(state_modules) == 3 and len(deployed.of_type(ACCOUNT)) == 4  # and the host's
    state_names = []
    for module in state_modules:
        (account,) = module.of_type(ACCOUNT)
        assert account.properties["allowSharedKeyAccess"] is False, "Entra ID only"
        assert {t.name for t in module.of_type(TABLE)} == {name for name, _ in names.TABLES}
        assert {role for role, *_ in assignments(module)} == {"Storage Table Data Contributor"}
        state_names.append(str(account.name))
    (host_module,) = resources.modules["storage"]
    assert host_module.of_type(TABLE) == []  # the scheduler's queues stay in the host's account
    host_roles = {role for role, *_ in assignments(host_module)}
    # The host: its blobs, its queues, and the retention archive's container (not the tables).
    assert host_roles == {"Storage Blob Data Owner", "Storage Queue Data Contributor", "Storage Blob Data Contributor"}
    # Distinct names of at most 24 characters: sts + the 13-character resource token + the index.
    template = (ROOT / "infra" / "resources.bicep").read_text()
    assert "i == 0 ? 'sts${resourceToken}' : 'sts${resourceToken}${i}'" in template

    settings = app_settings_of(deployed)
    assert settings[names.STATE_STORAGE_ACCOUNTS_SETTING] == ",".join(state_names)
    assert f"{names.STATE_STORAGE_CONNECTION}__accountName" not in settings  # one way to name the state
    assert settings[f"{names.STATE_STORAGE_CONNECTION}__credential"] == "managedidentity"
    for key in list(settings):
        monkeypatch.delenv(key, raising=False)
    for key, value in settings.items():
        monkeypatch.setenv(key, value if isinstance(value, str) else f"placeholder-for-{key}")
    # The names are deploy-time values (the resource token): placeholders of the same shape.
    monkeypatch.setenv(names.STATE_STORAGE_ACCOUNTS_SETTING, "stsabcdefghijklm,stsabcdefghijklm1,stsabcdefghijklm2")
    built = Settings()
    assert len(built.state_accounts()) == 3 and built.state_storage_client_id
    assert deployed.outputs["AZURE_STATE_STORAGE_ACCOUNT_NAMES"] is not None


def test_the_state_account_count_has_the_apps_bounds_and_one_is_todays_shape(deployment):
    for template in (MAIN, ROOT / "infra" / "resources.bicep"):
        lines = template.read_text().splitlines()
        (at,) = [i for i, line in enumerate(lines) if line.startswith("param stateStorageAccounts int = 1")]
        assert f"@maxValue({names.MAX_STATE_STORAGE_ACCOUNTS})" in lines[at - 2] and "@minValue(1)" in lines[at - 3]
    assert len(deployment.of_type(ACCOUNT)) == 1
    assert names.STATE_STORAGE_ACCOUNTS_SETTING not in app_settings_of(deployment)
    assert "`stateStorageAccounts`" in (ROOT / "docs" / "scale.md").read_text()
