"""The metrics the app records (core/names.py, adapters/telemetry.py) are the ones the
Bicep's log search alerts and workbook query, by the same names and attributes; the
alerts reach the operator through the action group; traces go to Application Insights
with identity and sampling as documented (docs/observability.md), and the local-only
telemetry files are never set in Azure."""

from __future__ import annotations

import json
import re

import pytest

from adapters.settings import Settings
from core import names
from core.models import ProcessState
from tests import ROOT
from tests.infra import bicep
from tests.infra.conftest import DEPLOY_PARAMS, MAIN, app_settings_of

QUERY_RULES = "Microsoft.Insights/scheduledQueryRules"
WORKBOOK = "Microsoft.Insights/workbooks"
ATTRIBUTES = {value for key, value in vars(names).items() if key.startswith("ATTR_")}


def metrics_in(query: str) -> set[str]:
    """The metric names a KQL query on customMetrics filters on (``name == "x"``, ``name in ("x", "y")``)."""
    found = set(re.findall(r'\bname\s*==\s*"([^"]+)"', query))
    for group in re.findall(r"\bname\s+in\s*\(([^)]*)\)", query):
        found |= set(re.findall(r'"([^"]+)"', group))
    return found


def attributes_in(query: str) -> set[str]:
    return set(re.findall(r'customDimensions\["([^"]+)"\]', query))


def rules(deployment) -> dict[str, bicep.Resource]:
    return {rule.symbol: rule for rule in deployment.of_type(QUERY_RULES)}


def workbook_queries(deployment) -> dict[str, dict]:
    (workbook,) = deployment.of_type(WORKBOOK)
    data = workbook.properties["serializedData"]
    assert isinstance(data, bicep.Unknown) and data.func == "string", "serializedData must be string(<the workbook>)"
    (content,) = data.args
    assert content["version"] == "Notebook/1.0"
    return {item["name"]: item["content"] for item in content["items"] if item["type"] == 3}


#: Application Insights' tables that sampling thins (the host's adaptive sampling, the app's trace sampler):
#: an alert or a chart that read them would count a share of the orders.
SAMPLED_TABLES = ("requests", "dependencies", "traces", "exceptions", "AppRequests", "AppDependencies", "AppTraces",
                  "AppExceptions")


def test_the_alerts_and_the_workbook_query_only_metrics_the_app_records(deployment):
    queries = [rule.properties["criteria"]["allOf"][0]["query"] for rule in rules(deployment).values()]
    queries += [item["query"] for item in workbook_queries(deployment).values()]
    assert len(queries) >= 4
    for query in queries:
        assert "customMetrics" in query, query
        # customMetrics are pre-aggregated and never sampled: the alerts and charts see every order
        # whatever traceSampleRatio and host.json's sampling keep of the traces.
        tables = set(re.findall(r"^\s*([A-Za-z_]+)\s*$", query, re.MULTILINE))
        assert not tables & set(SAMPLED_TABLES), f"a sampled table in {query}"
        assert not re.search(r"\b(" + "|".join(SAMPLED_TABLES) + r")\s*\|", query), query
        assert metrics_in(query), f"no metric named in {query}"
        unknown_metrics, unknown_attributes = metrics_in(query) - set(names.METRICS), attributes_in(query) - ATTRIBUTES
        assert not unknown_metrics, f"not a metric of core.names: {unknown_metrics}"
        assert not unknown_attributes, f"not an attribute of core.names: {unknown_attributes}"


def test_every_metric_is_on_the_workbook(deployment):
    shown = set().union(*(metrics_in(item["query"]) for item in workbook_queries(deployment).values()))
    assert shown == set(names.METRICS)


def test_the_workbook_shows_states_over_time_deadline_misses_and_compensations_per_step(deployment):
    items = workbook_queries(deployment)
    charts = {
        "orders-by-state": ({names.METRIC_ORDERS_CLOSED}, names.ATTR_STATE),
        "deadline-misses": ({names.METRIC_DEADLINE_MISSES}, names.ATTR_STEP),
        "compensations": ({names.METRIC_COMPENSATIONS}, names.ATTR_STEP),
    }
    for name, (metrics, attribute) in charts.items():
        content = items[name]
        assert metrics <= metrics_in(content["query"]) and attribute in attributes_in(content["query"]), name
        assert "bin(timestamp" in content["query"] and content["visualization"] == "timechart", name
        assert content["resourceType"] == "microsoft.insights/components" and content["version"] == "KqlItem/1.0"
    (workbook,) = deployment.of_type(WORKBOOK)
    component = bicep.ResourceId("applicationInsights", str(workbook.file))
    assert workbook.body["kind"] == "shared" and workbook.properties["category"] == "workbook"
    assert workbook.properties["sourceId"] == component
    assert workbook.name.func == "guid"  # a workbook's name is a GUID


def test_the_deadline_miss_alert_is_a_rate_per_step(deployment):
    rule = rules(deployment)["deadlineMisses"]
    (criterion,) = rule.properties["criteria"]["allOf"]
    query = criterion["query"]
    assert metrics_in(query) == {names.METRIC_DEADLINE_MISSES, names.METRIC_STEPS_CLAIMED}
    assert attributes_in(query) == {names.ATTR_STEP}
    assert "missPercent = 100.0 * misses / attempts" in query and "where attempts >= 20" in query
    assert criterion["metricMeasureColumn"] == "missPercent" and criterion["timeAggregation"] == "Maximum"
    assert criterion["dimensions"] == [{"name": "step", "operator": "Include", "values": ["*"]}]
    assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 5)


def test_the_compensation_alert_is_the_share_of_orders_undone(deployment):
    rule = rules(deployment)["compensations"]
    (criterion,) = rule.properties["criteria"]["allOf"]
    query = criterion["query"]
    assert metrics_in(query) == {names.METRIC_ORDERS_CLOSED} and attributes_in(query) == {names.ATTR_STATE}
    assert f'state == "{ProcessState.COMPENSATED.value}"' in query
    assert criterion["metricMeasureColumn"] == "compensatedPercent"
    assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 10)


def test_the_log_alerts_watch_application_insights_and_reach_the_operator(deployment):
    (alerts_module,) = deployment.deployments_of("alerts.bicep")
    (component,) = alerts_module.of_type("Microsoft.Insights/components", existing=True)
    (group,) = alerts_module.of_type("Microsoft.Insights/actionGroups")
    found = rules(deployment)
    assert set(found) == {"deadlineMisses", "compensations"}
    for rule in found.values():
        props = rule.properties
        assert rule.body["kind"] == "LogAlert" and props["enabled"] is True and props["autoMitigate"] is True
        assert props["scopes"] == [bicep.ResourceId(component.symbol, str(component.file))]
        assert props["actions"] == {"actionGroups": [bicep.ResourceId(group.symbol, str(group.file))]}
        assert bicep.iso_duration(props["windowSize"]) >= bicep.iso_duration(props["evaluationFrequency"])
        periods = props["criteria"]["allOf"][0]["failingPeriods"]
        assert periods == {"numberOfEvaluationPeriods": 1, "minFailingPeriodsToAlert": 1}
    # The alerts module's component is the one the app sends its telemetry to.
    (monitoring,) = deployment.deployments_of("monitoring.bicep")
    assert component.name == monitoring.outputs["applicationInsightsName"]


def test_telemetry_goes_to_application_insights_with_the_apps_identity_and_sampling(deployed_settings):
    assert {names.APPINSIGHTS_CONNECTION_SETTING, names.APPINSIGHTS_AUTHENTICATION_SETTING} <= set(deployed_settings)
    aliases = {alias for field in Settings.model_fields.values() for alias in field.validation_alias.choices}
    assert {names.APPINSIGHTS_CONNECTION_SETTING, names.APPINSIGHTS_AUTHENTICATION_SETTING} <= aliases
    # The local stack's files are never set in Azure.
    assert names.SPANS_FILE_SETTING not in deployed_settings and names.METRICS_FILE_SETTING not in deployed_settings
    assert deployed_settings["OTEL_TRACES_SAMPLER"] == "microsoft.fixed_percentage"
    # One order's trace in 100 by default: docs/scale.md, "The telemetry line" (its cost per million orders).
    assert deployed_settings["OTEL_TRACES_SAMPLER_ARG"] == "0.01"
    lower = app_settings_of(bicep.evaluate(MAIN, {**DEPLOY_PARAMS, "traceSampleRatio": "0.25"}))
    assert lower["OTEL_TRACES_SAMPLER_ARG"] == "0.25"


def test_the_operator_page_reads_spans_from_the_components_workspace_as_the_app(deployment, deployed_settings):
    # The app setting names the workspace id (customerId) of the workspace the component
    # sends to, and the app identity may query that workspace.
    (monitoring,) = deployment.deployments_of("monitoring.bicep")
    (workspace,) = monitoring.of_type("Microsoft.OperationalInsights/workspaces")
    (component,) = monitoring.of_type("Microsoft.Insights/components")
    assert component.properties["WorkspaceResourceId"] == bicep.ResourceId(workspace.symbol, str(workspace.file))
    setting = deployed_settings[names.APPINSIGHTS_WORKSPACE_SETTING]
    assert setting == monitoring.outputs["logAnalyticsWorkspaceId"]
    assert isinstance(setting, bicep.Unknown) and setting.text == f"{workspace.symbol}.properties.customerId"
    aliases = {alias for field in Settings.model_fields.values() for alias in field.validation_alias.choices}
    assert names.APPINSIGHTS_WORKSPACE_SETTING in aliases
    readers = [
        ra for ra in deployment.of_type("Microsoft.Authorization/roleAssignments")
        if ra.properties["roleDefinitionId"].endswith("/73c42c96-874c-492b-b04d-ab87d138a893")  # Log Analytics Reader
    ]
    assert len(readers) == 1, readers
    (reader,) = readers
    assert (reader.body["scope"].symbol, reader.body["scope"].file) == (workspace.symbol, str(workspace.file))
    assert reader.properties["principalId"].text == "identity.properties.principalId"
    assert reader.properties["principalType"] == "ServicePrincipal"


@pytest.mark.parametrize(
    ("authentication", "expected"),
    [
        ("ClientId=abc;Authorization=AAD", (True, "abc")),
        ("Authorization=AAD", (True, None)),
        ("authorization=aad; clientid=abc", (True, "abc")),
        (None, (False, None)),
    ],
)
def test_the_identity_is_read_from_the_authentication_string_as_the_host_reads_it(
    authentication, expected, monkeypatch
):
    monkeypatch.setenv(names.STORAGE_CONNECTION, "UseDevelopmentStorage=true")
    monkeypatch.setenv(names.SERVICEBUS_CONNECTION, "x")
    if authentication is None:
        monkeypatch.delenv(names.APPINSIGHTS_AUTHENTICATION_SETTING, raising=False)
    else:
        monkeypatch.setenv(names.APPINSIGHTS_AUTHENTICATION_SETTING, authentication)
    assert Settings().telemetry_identity() == expected


def test_host_json_keeps_what_explains_a_failure_and_drops_what_every_invocation_writes():
    """The host's share of the bill (docs/observability.md, "What each setting costs"): no request record of a
    successful invocation, no Executing/Executed/trigger traces, no worker line per invocation, no dependency
    of the host's own polling; every warning and error of the app (a failed order's record) and every failed
    invocation's request and exception kept, never sampled; the host's aggregate metrics kept."""
    logging = json.loads((ROOT / "host.json").read_text())["logging"]
    assert logging["logLevel"] == {"default": "Information", "Host.Results": "Error", "Function": "Warning",
                                   "Worker": "Warning", "Host.Aggregator": "Information"}
    insights = logging["applicationInsights"]
    assert insights["enableDependencyTracking"] is False
    assert insights["samplingSettings"]["isEnabled"] is True
    assert set(insights["samplingSettings"]["excludedTypes"].split(";")) == {"Request", "Exception", "Trace"}

