"""No keys anywhere; every service refuses key-based access; the app runs on Flex
Consumption as its user-assigned identity; alerts reach a person."""

from __future__ import annotations

import re
import tomllib

import pytest

from core import names
from tests.infra import bicep
from tests.infra.conftest import DEPLOY_PARAMS, INFRA, ROOT, bicep_files

#: Text that means a key or a key-bearing connection string is being handled.
FORBIDDEN = [
    r"listKeys\s*\(",
    r"\blist\w*Keys?\b",  # listKeys, listkeys on any resource
    r"listConnectionStrings",
    r"list(Account|Service)Sas",
    r"AccountKey\s*=",
    r"SharedAccessKey",
    r"SharedAccessSignature",
    r"DefaultEndpointsProtocol",
    r"InstrumentationKey\s*=",
    r"\b(primary|secondary)(Key|ConnectionString)\b",
    r"authorizationRules",
    r"@secure\(\)",  # nothing here is a secret; a secure parameter would mean one crept in
]
DEPLOYMENT_FILES = [*bicep_files(), INFRA / "main.parameters.json", ROOT / "azure.yaml"]


@pytest.mark.parametrize("path", DEPLOYMENT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_key_or_key_based_connection_string(path):
    text = path.read_text()
    for pattern in FORBIDDEN:
        match = re.search(pattern, text, re.IGNORECASE)
        assert not match, f"{path.name}: {match.group(0)!r} (pattern {pattern})"


def test_no_app_setting_is_a_connection_string(deployed_settings):
    for key, value in deployed_settings.items():
        literal = value if isinstance(value, str) else value.text
        assert not re.search(r"(Key|Signature|Password)\s*=", literal, re.IGNORECASE), f"{key} carries a credential"
    assert names.STORAGE_CONNECTION not in deployed_settings
    assert names.SERVICEBUS_CONNECTION not in deployed_settings
    # Not a credential: a reference to the component's own property (local auth is off).
    connection_string = deployed_settings["APPLICATIONINSIGHTS_CONNECTION_STRING"]
    assert connection_string.text == "applicationInsights.properties.ConnectionString"


def only(deployment: bicep.Deployment, resource_type: str) -> bicep.Resource:
    (resource,) = deployment.of_type(resource_type)
    return resource


def test_storage_accepts_entra_id_only(deployment):
    props = only(deployment, "Microsoft.Storage/storageAccounts").properties
    assert props["allowSharedKeyAccess"] is False
    assert props["allowBlobPublicAccess"] is False
    assert props["minimumTlsVersion"] == "TLS1_2"
    assert props["supportsHttpsTrafficOnly"] is True
    for container in deployment.of_type("Microsoft.Storage/storageAccounts/blobServices/containers"):
        assert container.properties["publicAccess"] == "None"


def test_service_bus_is_standard_with_local_auth_disabled(deployment):
    namespace = only(deployment, "Microsoft.ServiceBus/namespaces")
    assert namespace.body["sku"]["name"] == "Standard"
    assert namespace.properties["disableLocalAuth"] is True
    assert namespace.properties["minimumTlsVersion"] == "1.2"


def test_application_insights_takes_entra_id_tokens_only(deployment, deployed_settings):
    component = only(deployment, "Microsoft.Insights/components")
    assert component.properties["DisableLocalAuth"] is True
    assert component.properties["WorkspaceResourceId"] == bicep.ResourceId(
        "logAnalytics", str(only(deployment, "Microsoft.OperationalInsights/workspaces").file)
    )
    auth = deployed_settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"]
    assert auth.text == "'ClientId=${identityClientId};Authorization=AAD'"


def test_function_app_is_flex_consumption_linux_python_313(deployment):
    plan = only(deployment, "Microsoft.Web/serverfarms")
    assert plan.body["sku"] == {"tier": "FlexConsumption", "name": "FC1"}
    assert plan.properties["reserved"] is True
    site = only(deployment, "Microsoft.Web/sites")
    assert site.body["kind"] == "functionapp,linux"
    config = site.properties["functionAppConfig"]
    assert config["runtime"] == {"name": "python", "version": "3.13"}
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.13", "the deployed runtime is the tested Python version"
    assert site.properties["httpsOnly"] is True
    assert site.properties["siteConfig"]["minTlsVersion"] == "1.2"


def test_function_app_runs_as_the_user_assigned_identity(deployment, deployed_settings):
    site = only(deployment, "Microsoft.Web/sites")
    identity = site.body["identity"]
    assert identity["type"] == "UserAssigned"
    assert list(identity["userAssignedIdentities"]) == ["'${identityId}'"]  # the one identityId param
    storage = site.properties["functionAppConfig"]["deployment"]["storage"]
    assert storage["type"] == "blobContainer"
    assert storage["authentication"]["type"] == "UserAssignedIdentity"
    (uami,) = deployment.of_type("Microsoft.ManagedIdentity/userAssignedIdentities")
    assert storage["authentication"]["userAssignedIdentityResourceId"] == bicep.ResourceId(uami.symbol, str(uami.file))
    # Every clientId names the same identity the app runs as.
    client_ids = {k: v for k, v in deployed_settings.items() if k.endswith("__clientId") or k == "AZURE_CLIENT_ID"}
    assert len(client_ids) >= 3
    assert {v.text for v in client_ids.values()} == {"identity.properties.clientId"}


def test_no_setting_flex_consumption_rejects(deployed_settings):
    for key in ("FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION", "WEBSITE_RUN_FROM_PACKAGE",
                "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING", "WEBSITE_CONTENTSHARE"):
        assert key not in deployed_settings, key


def test_alerts_reach_the_operator_by_email(deployment):
    group = only(deployment, "Microsoft.Insights/actionGroups")
    (receiver,) = group.properties["emailReceivers"]
    assert receiver["emailAddress"] == DEPLOY_PARAMS["alertEmail"]
    group_id = bicep.ResourceId(group.symbol, str(group.file))
    alerts = {a.symbol: a for a in deployment.of_type("Microsoft.Insights/metricAlerts")}
    criteria = {}
    for alert in alerts.values():
        props = alert.properties
        assert props["enabled"] is True
        assert props["actions"] == [{"actionGroupId": group_id}], alert
        (scope,) = props["scopes"]
        assert isinstance(scope, bicep.ResourceId)
        (criterion,) = props["criteria"]["allOf"]
        assert criterion["metricNamespace"] == "Microsoft.ServiceBus/namespaces"
        assert criterion["operator"] == "GreaterThan" and criterion["threshold"] == 0
        (dimension,) = criterion["dimensions"]
        assert dimension["name"] == "EntityName" and dimension["operator"] == "Include"
        criteria[criterion["metricName"]] = dimension["values"]
    assert criteria == {
        "DeadletteredMessages": ["*"],  # any queue
        "ActiveMessages": [names.ALERTS_QUEUE],  # the operator alerts queue
    }


def test_alert_scopes_are_the_service_bus_namespace(deployment):
    (alerts_module,) = deployment.deployments_of("alerts.bicep")
    (existing,) = alerts_module.of_type("Microsoft.ServiceBus/namespaces", existing=True)
    for alert in alerts_module.of_type("Microsoft.Insights/metricAlerts"):
        assert alert.properties["scopes"] == [bicep.ResourceId(existing.symbol, str(existing.file))]
