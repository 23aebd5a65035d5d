"""Role assignments: every role id is the documented built-in role its comment names;
each assignment is named guid(scope.id, principalId, roleId); the app identity (and the
developer, when principalId is given) get exactly the data roles the design needs."""

from __future__ import annotations

import re

import pytest

from tests.infra import bicep
from tests.infra.conftest import DEVELOPER_ID, bicep_files

#: Built-in role definition ids, copied from Microsoft's "Azure built-in roles" pages
#: (learn.microsoft.com/azure/role-based-access-control/built-in-roles/<category>):
#: each id is the "name" in the role's JSON definition there.
BUILT_IN_ROLES = {
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",  # Storage
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",  # Storage
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",  # Storage
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",  # Storage
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "Azure Service Bus Data Sender",  # Integration
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "Azure Service Bus Data Receiver",  # Integration
    "090c5cfd-751d-490a-894a-3ce6f1109419": "Azure Service Bus Data Owner",  # Integration
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",  # Monitor
    "73c42c96-874c-492b-b04d-ab87d138a893": "Log Analytics Reader",  # Monitor
}
ROLE_ASSIGNMENT = "Microsoft.Authorization/roleAssignments"
GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)

#: Roles and the resource type they are granted on.
ARCHIVE_CONTAINER = "Microsoft.Storage/storageAccounts/blobServices/containers"
APP_ROLES = {
    ("Storage Blob Data Owner", "Microsoft.Storage/storageAccounts"),
    ("Storage Blob Data Contributor", ARCHIVE_CONTAINER),  # retention's archive, that container only
    ("Storage Queue Data Contributor", "Microsoft.Storage/storageAccounts"),
    ("Storage Table Data Contributor", "Microsoft.Storage/storageAccounts"),
    ("Azure Service Bus Data Sender", "Microsoft.ServiceBus/namespaces"),
    ("Azure Service Bus Data Receiver", "Microsoft.ServiceBus/namespaces"),
    ("Azure Service Bus Data Owner", "Microsoft.ServiceBus/namespaces"),  # scale monitoring (optional)
    ("Monitoring Metrics Publisher", "Microsoft.Insights/components"),
    ("Log Analytics Reader", "Microsoft.OperationalInsights/workspaces"),  # the operator page's spans
}
#: What the developer gets with principalId: the data roles, to run the operator CLI.
DEVELOPER_ROLES = {
    ("Storage Blob Data Owner", "Microsoft.Storage/storageAccounts"),
    ("Storage Blob Data Contributor", ARCHIVE_CONTAINER),
    ("Storage Queue Data Contributor", "Microsoft.Storage/storageAccounts"),
    ("Storage Table Data Contributor", "Microsoft.Storage/storageAccounts"),
    ("Azure Service Bus Data Sender", "Microsoft.ServiceBus/namespaces"),
    ("Azure Service Bus Data Receiver", "Microsoft.ServiceBus/namespaces"),
}


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.name)
def test_every_role_id_is_the_documented_role_its_comment_names(path):
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for role_id in GUID.findall(line):
            where = f"{path.name}:{number}"
            assert role_id.lower() in BUILT_IN_ROLES, f"{where}: {role_id} is not a documented built-in role here"
            comment = line.partition("//")[2].strip()
            assert comment == BUILT_IN_ROLES[role_id.lower()], (
                f"{where}: {role_id} is {BUILT_IN_ROLES[role_id.lower()]!r}, the comment says {comment!r}"
            )


def assignments(deployment: bicep.Deployment) -> list[tuple[str, str, object, bicep.Resource]]:
    """(role name, scope resource type, principal, resource) for every role assignment."""
    found = []
    for ra in deployment.of_type(ROLE_ASSIGNMENT):
        props = ra.properties
        role_id = props["roleDefinitionId"]
        assert isinstance(role_id, str) and role_id.startswith(
            "/subscriptions/{subscriptionId}/providers/Microsoft.Authorization/roleDefinitions/"
        ), f"{ra}: roleDefinitionId must be subscriptionResourceId('Microsoft.Authorization/roleDefinitions', id)"
        guid = role_id.rsplit("/", 1)[1]
        assert guid in BUILT_IN_ROLES, f"{ra}: unknown role {guid}"
        scope = ra.body.get("scope")
        assert isinstance(scope, bicep.ResourceRef), f"{ra}: scope must be the resource the role is for"
        name = ra.name
        assert isinstance(name, bicep.Unknown) and name.func == "guid", f"{ra}: name must be guid(...)"
        assert len(name.args) == 3, f"{ra}: guid(scope.id, principalId, roleId)"
        scope_id = bicep.ResourceId(scope.symbol, scope.file)
        assert name.args[0] == scope_id, f"{ra}: guid's first argument is not {scope.symbol}.id"
        assert name.args[1] == props["principalId"], f"{ra}: guid's second argument is not the principal"
        assert name.args[2] == guid, f"{ra}: guid's third argument is not the role id"
        assert props["principalType"] in ("ServicePrincipal", "User"), ra
        found.append((BUILT_IN_ROLES[guid], scope.type, props["principalId"], ra))
    return found


def test_app_identity_gets_the_roles_the_design_needs(deployment):
    found = assignments(deployment)
    principals = {p if isinstance(p, str) else p.text for _, _, p, _ in found}
    assert principals == {"identity.properties.principalId"}, f"only the app gets roles by default: {principals}"
    granted = {(role, scope) for role, scope, _, _ in found}
    assert granted == APP_ROLES
    assert all(ra.properties["principalType"] == "ServicePrincipal" for *_, ra in found)


def test_service_bus_owner_for_scaling_is_optional():
    from tests.infra.conftest import DEPLOY_PARAMS, MAIN

    without = bicep.evaluate(MAIN, {**DEPLOY_PARAMS, "serviceBusScaleMonitoring": False})
    granted = {(role, scope) for role, scope, _, _ in assignments(without)}
    assert granted == APP_ROLES - {("Azure Service Bus Data Owner", "Microsoft.ServiceBus/namespaces")}


def test_developer_gets_the_data_roles(deployment_with_developer):
    found = assignments(deployment_with_developer)
    developer = {(role, scope) for role, scope, principal, _ in found if principal == DEVELOPER_ID}
    assert developer == DEVELOPER_ROLES
    types = {ra.properties["principalType"] for _, _, principal, ra in found if principal == DEVELOPER_ID}
    assert types == {"User"}


#: Roles that let a principal put messages on the app's internal queues (Service Bus:
#: agent-responses, <remote>-requests; storage: the scheduler queue of nudges).
SENDING_ROLES = {"Azure Service Bus Data Sender", "Azure Service Bus Data Owner", "Storage Queue Data Contributor"}


def test_only_the_app_identity_may_send_to_the_internal_queues(deployment):
    """docs/failure-handling.md: the checks on internal messages are defence in depth;
    the guarantee is that, as deployed, no one but the app can send to those queues
    (shared keys are off: test_security_and_platform.py)."""
    senders = {
        p if isinstance(p, str) else p.text for role, _, p, _ in assignments(deployment) if role in SENDING_ROLES
    }
    assert senders == {"identity.properties.principalId"}, senders
