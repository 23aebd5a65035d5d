"""The templates provision what the app uses: what its bindings name, what core/names.py
lists, a request queue and a base URL for every remote service of core/workflow.py, and
every app setting its Settings class needs. No Azure needed."""

from __future__ import annotations

import json
import re

import pytest

from core import names
from core.workflow import remotes
from adapters.settings import Settings
from tests.infra import bicep
from tests.infra.conftest import (
    DEPLOY_PARAMS,
    INFRA,
    MAIN,
    ROOT,
    app_settings_of,
    names_of,
    remote_url,
    url_parameter,
)

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


def test_every_scheduler_queue_is_read_by_one_function_of_its_own(function_bindings, deployed_settings, deployment):
    """One queue-triggered scheduler function per shard (and ``schedule_order`` on the queue of
    before the sharding), each on the queue its %SCHEDULER_QUEUE_<n>% setting names, all in
    the host's account; nothing else reads them. Only ``submit_order`` writes to them by
    binding: one output per shard's queue (its nudge, so the host wakes its own listener at
    once), in the account the listeners read; nothing writes to the queue of before the sharding."""
    readers: dict[str, list[str]] = {}
    writers: dict[str, list[str]] = {}
    for function, bindings in function_bindings.items():
        for binding in bindings:
            if binding["type"] in ("queueTrigger", "queue"):
                found = readers if binding["type"] == "queueTrigger" else writers
                found.setdefault(resolve(binding["queueName"], deployed_settings), []).append(function)
                assert binding.get("connection") == names.STORAGE_CONNECTION, function
    expected = {name: [names.schedule_function(shard)] for shard, (name, _) in enumerate(names.SCHEDULER_QUEUES)}
    expected[names.SCHEDULER_QUEUE] = [names.SCHEDULE_FUNCTION]
    assert readers == expected
    # Disabling these holds every claim back (tests/e2e/test_cancel_before_claim.py).
    assert sorted(names.schedule_functions()) == sorted(f for readers_of in expected.values() for f in readers_of)
    assert writers == {name: ["submit_order"] for name, _ in names.SCHEDULER_QUEUES}
    assert len(names.SCHEDULER_QUEUES) == names.SCHEDULER_QUEUE_SHARDS
    assert {deployed_settings[setting] for _, setting in names.SCHEDULER_QUEUES} <= names_of(deployment, STORAGE_QUEUE)


def test_nudges_are_base64_whoever_sends_them(deployed_settings):
    """The submission's nudge goes through a queue output binding, which the host encodes as
    host.json ``messageEncoding`` says; every other nudge through the Nudger's SDK client,
    base64 (adapters/clients.py queue_client). Both must be what the trigger decodes."""
    from azure.storage.queue import TextBase64EncodePolicy

    from adapters import clients

    queues = json.loads((ROOT / "host.json").read_text())["extensions"]["queues"]
    assert queues.get("messageEncoding", "base64") == "base64"
    assert not any(key.lower().endswith("__messageencoding") for key in deployed_settings), "overridden in Azure"
    client = clients.queue_client(Settings.model_construct(storage_connection_string="UseDevelopmentStorage=true"), "q")
    assert isinstance(client._message_encode_policy, TextBase64EncodePolicy)


def test_tables_match_core_names(deployment):
    assert names_of(deployment, TABLE) == {name for name, _ in names.TABLES}


def test_name_settings_point_at_the_provisioned_names(deployed_settings):
    assert {k: deployed_settings.get(k) for k in names.NAME_SETTINGS} == names.NAME_SETTINGS


def test_both_connections_are_identity_based(deployed_settings):
    assert_identity_connection(names.SERVICEBUS_CONNECTION, SB_QUEUE, deployed_settings)
    assert_identity_connection(names.STORAGE_CONNECTION, TABLE, deployed_settings)


# --- core/workflow.py: one request queue and one base URL per remote service ----------------

REMOTES = remotes()


def test_the_workflows_call_remote_services():
    assert REMOTES, "core.workflow names no remote service: the per-remote tests would check nothing"


@pytest.mark.parametrize("remote", REMOTES)
def test_each_remote_has_a_required_url_parameter(remote):
    """main.bicep and resources.bicep take the base URL as a required, documented
    parameter, and main.parameters.json reads it from the azd environment variable
    named like the app setting."""
    parameter, setting = url_parameter(remote), names.remote_url_setting(remote)
    for path in (MAIN, INFRA / "resources.bicep"):
        declared = bicep.template(path.resolve()).params
        assert parameter in declared, f"{path.name}: no parameter {parameter} for remote service {remote!r} ({setting})"
        assert declared[parameter].node is None, f"{path.name}: {parameter} must be required (no default)"
        declaration = re.search(
            rf"@minLength\(1\)\n@description\('[^\n]*\b{setting}\b[^\n]*'\)\nparam {parameter} string\n",
            path.read_text(),
        )
        assert declaration, f"{path.name}: {parameter} needs @minLength(1) and a @description naming {setting}"
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert parameters.get(parameter) == {"value": f"${{{setting}}}"}, f"main.parameters.json: {parameter}"


@pytest.mark.parametrize("remote", REMOTES)
def test_each_remote_gets_its_url_setting_from_its_parameter(remote):
    other = f"https://other-{remote}.example.test/base"
    deployed = app_settings_of(bicep.evaluate(MAIN, {**DEPLOY_PARAMS, url_parameter(remote): other}))
    assert deployed.get(names.remote_url_setting(remote)) == other
    for neighbour in REMOTES:
        if neighbour != remote:
            assert deployed.get(names.remote_url_setting(neighbour)) == remote_url(neighbour)


@pytest.mark.parametrize("remote", REMOTES)
def test_each_remote_has_its_agent_request_queue(remote, function_bindings, deployment, deployed_settings):
    """The agent function run_<remote>_agent is triggered by %<REMOTE>_REQUESTS_QUEUE%,
    which the Bicep sets to the <remote>-requests queue it provisions, with the
    properties of core.names.SERVICEBUS_QUEUES."""
    queue, setting = names.requests_queue(remote), names.requests_queue_setting(remote)
    agent = names.agent_function(remote)
    assert agent in function_bindings, f"no agent function {agent} for remote service {remote!r}"
    triggers = [b for b in function_bindings[agent] if b["type"] == "serviceBusTrigger"]
    assert [b["queueName"] for b in triggers] == [f"%{setting}%"], f"{agent}: {triggers}"
    assert deployed_settings.get(setting) == queue, f"app setting {setting} must name the queue {queue!r}"
    provisioned = {q.name: q.properties for q in deployment.of_type(SB_QUEUE)}
    assert queue in provisioned, f"no Service Bus queue {queue!r} for remote service {remote!r}"
    (spec,) = [q for q in names.SERVICEBUS_QUEUES if q.name == queue]  # all properties: the test above
    assert provisioned[queue]["maxDeliveryCount"] == spec.max_delivery_count, queue
    assert provisioned[queue]["deadLetteringOnMessageExpiration"] is spec.dead_letter_on_expiry, queue


def test_no_queue_setting_or_parameter_for_a_remote_the_workflows_do_not_call(deployment, deployed_settings):
    queues = {name for name in names_of(deployment, SB_QUEUE) if name.endswith("-requests")}
    assert queues == {names.requests_queue(r) for r in REMOTES}
    queue_settings = {k for k in deployed_settings if k.endswith("_REQUESTS_QUEUE")}
    assert queue_settings == {names.requests_queue_setting(r) for r in REMOTES}
    url_settings = {k for k in deployed_settings if re.fullmatch(r"REMOTE_\w+_URL", k)}
    assert url_settings == set(names.REMOTE_URL_SETTINGS.values())
    for path in (MAIN, INFRA / "resources.bicep"):
        parameters = {p for p in bicep.template(path.resolve()).params if re.fullmatch(r"remote\w*Url", p)}
        assert parameters == {url_parameter(r) for r in REMOTES}, path.name


def test_local_settings_template_names_the_same_queues_and_remotes():
    """local.settings.template.json (what `make setup` copies for the local stack) sets
    every name setting to its core.names default and a base URL for every remote."""
    values = json.loads((ROOT / "local.settings.template.json").read_text())["Values"]
    assert {k: values.get(k) for k in names.NAME_SETTINGS} == names.NAME_SETTINGS
    urls = {k for k in values if re.fullmatch(r"REMOTE_\w+_URL", k)}
    assert urls == set(names.REMOTE_URL_SETTINGS.values())
    queue_settings = {k for k in values if k.endswith("_REQUESTS_QUEUE")}
    assert queue_settings == {names.requests_queue_setting(r) for r in REMOTES}


# --- adapters/settings.py ------------------------------------------------------------------


def aliases(field) -> list[str]:
    alias = field.validation_alias
    return list(getattr(alias, "choices", None) or [alias])


def test_every_required_setting_is_set(deployed_settings):
    required = {name: aliases(f) for name, f in Settings.model_fields.items() if f.is_required()}
    # Per remote service, not fields of their own: each agent fails without its URL.
    required |= {f"remote_urls[{remote}]": [setting] for remote, setting in names.REMOTE_URL_SETTINGS.items()}
    assert required, "no setting is required: this test would check nothing"
    for field, field_aliases in required.items():
        assert any(a in deployed_settings for a in field_aliases), f"Settings.{field}: none of {field_aliases} is set"


def test_settings_validate_from_the_deployed_app_settings(deployed_settings, monkeypatch):
    """Build Settings from exactly what the Bicep sets (deploy-time values as placeholders)."""
    for field in Settings.model_fields.values():
        for alias in aliases(field):
            monkeypatch.delenv(alias, raising=False)
    for remote in REMOTES:  # read from the environment by name, not as fields
        monkeypatch.delenv(names.remote_url_setting(remote), raising=False)
        monkeypatch.delenv(names.requests_queue_setting(remote), raising=False)
    for key, value in deployed_settings.items():
        monkeypatch.setenv(key, value if isinstance(value, str) else f"placeholder-for-{key}")
    settings = Settings()
    assert settings.storage_connection_string is None and settings.servicebus_connection_string is None
    assert settings.storage_client_id and settings.servicebus_client_id
    assert settings.orders_queue == names.ORDERS_QUEUE
    assert settings.scheduler_queue == names.SCHEDULER_QUEUE
    assert settings.requests_queues == {remote: names.requests_queue(remote) for remote in REMOTES}
    assert settings.remote_urls == {remote: remote_url(remote) for remote in REMOTES}
    for remote in REMOTES:
        assert settings.remote_url(remote) == remote_url(remote)
    assert settings.supervisor_schedule == names.DEFAULT_SUPERVISOR_SCHEDULE
    assert (settings.step_timeout_seconds, settings.pending_timeout_seconds, settings.max_failures) == (30, 30, 3)
    assert settings.approval_timeout_seconds == names.DEFAULT_APPROVAL_TIMEOUT_SECONDS


#: App setting -> (main.bicep parameter, a value to pass, what the setting must become).
#: (Each remote service's REMOTE_<NAME>_URL: test_each_remote_gets_its_url_setting_from_its_parameter.)
TUNING = {
    "STEP_TIMEOUT_SECONDS": ("stepTimeoutSeconds", 41, "41"),
    "PENDING_TIMEOUT_SECONDS": ("pendingTimeoutSeconds", 43, "43"),
    "RESPONSE_GRACE_SECONDS": ("responseGraceSeconds", 120, "120"),
    "MAX_FAILURES": ("maxFailures", 7, "7"),
    "APPROVAL_TIMEOUT_SECONDS": ("approvalTimeoutSeconds", 3600, "3600"),
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


def test_the_worker_thread_pool_is_set_explicitly_and_alike_everywhere():
    import json

    from core import names
    from tests.infra.conftest import ROOT

    resources = (ROOT / "infra" / "resources.bicep").read_text()
    assert f"{names.WORKER_THREADS_SETTING}: string(workerThreads)" in resources
    assert f"param workerThreads int = {names.WORKER_THREADS}" in resources
    assert f"param workerThreads int = {names.WORKER_THREADS}" in (ROOT / "infra" / "main.bicep").read_text()
    template = json.loads((ROOT / "local.settings.template.json").read_text())["Values"]
    assert template[names.WORKER_THREADS_SETTING] == str(names.WORKER_THREADS)
