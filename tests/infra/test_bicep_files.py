"""The Bicep files parse, use only API versions someone checked against the docs, and
agree with main.parameters.json and azure.yaml. Offline: no Bicep CLI, no Azure."""

from __future__ import annotations

import json
import re

import pytest

from tests.infra import bicep
from tests.infra.conftest import INFRA, MAIN, ROOT, bicep_files

#: Every resource type@apiVersion the templates may use, each checked against Microsoft
#: documentation. A new type or version fails the test until it is checked and added.
#:
#: [Q] learn.microsoft.com "Quickstart: Create and deploy Azure Functions resources using
#:     Bicep" (functions-create-first-function-bicep; Flex Consumption + managed identity)
#: [T] learn.microsoft.com/azure/templates (Bicep resource reference for that version)
VERIFIED_API_VERSIONS = {
    "Microsoft.Resources/resourceGroups": "2022-09-01",  # [T] + "Create resource groups by using Bicep"
    "Microsoft.ManagedIdentity/userAssignedIdentities": "2023-01-31",  # [Q]
    "Microsoft.OperationalInsights/workspaces": "2023-09-01",  # [Q]
    "Microsoft.Insights/components": "2020-02-02",  # [Q] (DisableLocalAuth, WorkspaceResourceId)
    "Microsoft.Storage/storageAccounts": "2023-05-01",  # [Q] (allowSharedKeyAccess, minimumTlsVersion)
    "Microsoft.Storage/storageAccounts/blobServices": "2023-05-01",  # [Q]
    "Microsoft.Storage/storageAccounts/blobServices/containers": "2023-05-01",  # [Q]
    "Microsoft.Storage/storageAccounts/queueServices": "2023-05-01",  # [T]
    "Microsoft.Storage/storageAccounts/queueServices/queues": "2023-05-01",  # [T]
    "Microsoft.Storage/storageAccounts/tableServices": "2023-05-01",  # [T]
    "Microsoft.Storage/storageAccounts/tableServices/tables": "2023-05-01",  # [T]
    "Microsoft.Authorization/roleAssignments": "2022-04-01",  # [Q]
    "Microsoft.Web/serverfarms": "2024-04-01",  # [Q] (FC1 / FlexConsumption)
    "Microsoft.Web/sites": "2024-04-01",  # [Q] (functionAppConfig, deployment storage UserAssignedIdentity)
    # [Q] (appsettings); authsettingsV2: [T] and azure-rest-api-specs Microsoft.Web/stable/2024-04-01
    # examples/UpdateAuthSettingsV2.json (platform, globalValidation, identityProviders, login, httpSettings)
    "Microsoft.Web/sites/config": "2024-04-01",
    "Microsoft.ServiceBus/namespaces": "2024-01-01",  # [T] (disableLocalAuth, minimumTlsVersion)
    "Microsoft.ServiceBus/namespaces/queues": "2024-01-01",  # [T]
    "Microsoft.Insights/actionGroups": "2022-04-01",  # [T] (emailReceivers.useCommonAlertSchema)
    "Microsoft.Insights/metricAlerts": "2018-03-01",  # [T] (SingleResourceMultipleMetricCriteria)
    # [T] (kind LogAlert; criteria.allOf: query, timeAggregation, metricMeasureColumn, dimensions,
    # failingPeriods; actions.actionGroups)
    "Microsoft.Insights/scheduledQueryRules": "2021-08-01",
    "Microsoft.Insights/workbooks": "2023-06-01",  # [T] (kind shared, a GUID name; serializedData, sourceId, category)
}


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: str(p.relative_to(INFRA)))
def test_bicep_file_parses(path):
    assert bicep.syntax_errors(path.read_bytes()) == []


def test_there_are_bicep_files():
    names = {str(p.relative_to(INFRA)) for p in bicep_files()}
    assert "main.bicep" in names and len(names) > 1, names


BROKEN = {
    "unclosed object": "resource sa 'Microsoft.Storage/storageAccounts@2023-05-01' = {\n  name: 'x'\n",
    "missing value": "param location string =\nvar x = 1\n",
    "stray token": "var names = {\n  a: 'b'\n} }\n",
    "bad keyword": "resrouce sa 'Microsoft.Storage/storageAccounts@2023-05-01' = {\n  name: 'x'\n}\n",
}


@pytest.mark.parametrize("snippet", sorted(BROKEN))
def test_parser_reports_broken_bicep(snippet):
    """The parse check is real: broken input is reported, with a position."""
    errors = bicep.syntax_errors(BROKEN[snippet])
    assert errors, f"{snippet!r} parsed without error"
    assert re.match(r"\d+:\d+: ", errors[0]), errors


def test_parser_accepts_a_valid_snippet():
    assert bicep.syntax_errors("param x string = 'a'\noutput y string = '${x}-b'\n") == []


LAMBDAS = """param items array = [
  {
    name: 'a'
    url: 'https://a.test'
  }
  {
    name: 'b'
    url: 'https://b.test'
  }
]
output settings object = toObject(items, item => 'URL_${toUpper(item.name)}', item => item.url)
output byName object = toObject(items, item => item.name)
output names array = map(items, item => item.name)
output indexed array = map(items, (item, i) => '${i}:${item.name}')
output onlyA array = filter(items, item => item.name == 'a')
"""


def test_reader_applies_lambdas_as_bicep_does(tmp_path):
    """``item => item.url`` is the lambda of ``item.url`` (the pinned grammar nests it the
    other way round; the reader undoes that), as the templates' toObject() relies on."""
    path = tmp_path / "lambdas.bicep"
    path.write_text(LAMBDAS)
    assert bicep.syntax_errors(LAMBDAS) == []
    outputs = bicep.evaluate(path).outputs
    a, b = {"name": "a", "url": "https://a.test"}, {"name": "b", "url": "https://b.test"}
    assert outputs == {
        "settings": {"URL_A": "https://a.test", "URL_B": "https://b.test"},
        "byName": {"a": a, "b": b},
        "names": ["a", "b"],
        "indexed": ["0:a", "1:b"],
        "onlyA": [a],
    }


def test_every_resource_uses_a_verified_api_version(deployment_with_developer):
    seen = {}
    for resource in deployment_with_developer.all_resources():
        seen.setdefault(resource.type, set()).add(resource.api_version)
    for resource_type, versions in sorted(seen.items()):
        assert resource_type in VERIFIED_API_VERSIONS, f"{resource_type}: check the API version in the docs, add it"
        assert versions == {VERIFIED_API_VERSIONS[resource_type]}, f"{resource_type}: {versions}"


def test_every_file_is_reached_from_main(deployment):
    reached = set()

    def walk(d):
        reached.add(d.file)
        for children in d.modules.values():
            for child in children:
                walk(child)

    walk(deployment)
    assert {p.resolve() for p in bicep_files()} == reached


def test_no_loop_on_a_nested_child_resource():
    """Bicep cannot loop a nested child resource, nor loop a resource that nests children."""
    for path in bicep_files():
        tpl = bicep.template(path.resolve())
        for name, decl in tpl.resources.items():
            looped = decl.node.type == "for_statement"
            assert not (looped and decl.parent is not None), f"{path.name}: {name} is a looped nested child"
            assert not (looped and any(d.parent is decl for d in tpl.resources.values())), f"{path.name}: {name}"


def test_parameters_file_matches_main():
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    declared = bicep.template(MAIN.resolve()).params
    assert set(parameters) <= set(declared), set(parameters) - set(declared)
    required = {name for name, decl in declared.items() if decl.node is None}
    assert required <= set(parameters), f"required parameters azd would not pass: {required - set(parameters)}"
    for name, entry in parameters.items():
        assert re.fullmatch(r"\$\{[A-Z_]+(=[^}]*)?\}", entry["value"]), f"{name}: azd environment reference expected"


def test_resource_group_template_deploys_the_same_resources(deployment):
    """resources.bicep alone (az deployment group create) = main.bicep minus the group."""
    from tests.infra.conftest import DEPLOY_PARAMS

    main_params = bicep.template(MAIN.resolve()).params
    group_params = bicep.template((INFRA / "resources.bicep").resolve()).params
    # main.bicep's stamps and stampLocations become each stamp's stamp and location.
    assert set(group_params) - {"stamp"} == set(main_params) - {"resourceGroupName", "stamps", "stampLocations"}
    # main.bicep passes every parameter through unchanged.
    (module,) = [d for d in deployment.modules["resources"]]
    assert module.file.name == "resources.bicep"
    standalone = bicep.evaluate(INFRA / "resources.bicep", {k: v for k, v in DEPLOY_PARAMS.items() if k != "location"})

    def shape(d):
        return sorted((r.type, str(r.name)) for r in d.all_resources())

    assert shape(standalone) == shape(module)
    assert set(standalone.outputs) <= set(deployment.outputs)


def test_azure_yaml_deploys_this_folder_to_the_tagged_app(deployment):
    text = (ROOT / "azure.yaml").read_text()
    assert re.search(r"^infra:\n(?:  .*\n)*?  provider: bicep\n", text, re.MULTILINE)
    assert re.search(r"^infra:\n(?:  .*\n)*?  path: infra\n", text, re.MULTILINE)
    service = re.search(r"^services:\n  ([\w-]+):\n((?:    .*\n)+)", text, re.MULTILINE)
    assert service, "azure.yaml declares no service"
    name, body = service.group(1), service.group(2)
    assert "project: .\n" in body and "language: python\n" in body and "host: function\n" in body
    (site,) = deployment.of_type("Microsoft.Web/sites")
    assert site.body["tags"].get("azd-service-name") == name


def test_outputs_are_azd_style(deployment):
    assert deployment.outputs
    for name in deployment.outputs:
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", name), f"output {name} is not upper-case"
    for wanted in (
        "AZURE_RESOURCE_GROUP",
        "AZURE_FUNCTION_APP_NAME",
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_SERVICEBUS_NAMESPACE_NAME",
        "AZURE_SERVICEBUS_FULLY_QUALIFIED_NAMESPACE",
    ):
        assert wanted in deployment.outputs, wanted
    fqdn = deployment.outputs["AZURE_SERVICEBUS_FULLY_QUALIFIED_NAMESPACE"]
    assert fqdn.text.endswith(".servicebus.windows.net'"), fqdn
