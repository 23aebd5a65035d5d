"""Stamps (docs/scale.md, "Past one deployment: stamps"): main.bicep's ``stamps`` deploys that
many whole copies of resources.bicep, each in a resource group of its own with names of its
own; ``stamps=1`` is the deployment without stamps, unchanged. Evaluated offline
(tests/infra/bicep.py)."""

from __future__ import annotations

import pytest

from tests.infra import bicep
from tests.infra.conftest import DEPLOY_PARAMS, MAIN

GROUP = "Microsoft.Resources/resourceGroups"
NAMESPACE = "Microsoft.ServiceBus/namespaces"
SITE = "Microsoft.Web/sites"


RESOURCES = MAIN.parent / "resources.bicep"


def deploy(**params) -> bicep.Deployment:
    return bicep.evaluate(MAIN, {**DEPLOY_PARAMS, **params})


def resource_token(**params) -> tuple:
    """The known arguments resources.bicep hashes into every name (its ``resourceToken``,
    toLower(uniqueString(...))) for these parameters: the names themselves are deploy-time values."""
    group_params = {**{k: v for k, v in DEPLOY_PARAMS.items() if k != "location"}, **params}
    token = bicep._Scope(bicep.template(RESOURCES.resolve()), group_params).lookup("resourceToken", {})  # noqa: SLF001
    assert isinstance(token, bicep.Unknown) and token.func == "toLower", token
    (unique,) = token.args
    assert unique.func == "uniqueString", unique
    return tuple("<subscription>" if isinstance(a, bicep.Unknown) else a for a in unique.args)


def test_by_default_one_stamp_with_the_names_of_a_deployment_without_stamps(deployment):
    (group,) = deployment.of_type(GROUP)
    assert group.name == "rg-ci" and group.body["location"] == DEPLOY_PARAMS["location"]
    (stamp,) = deployment.modules["resources"]
    assert stamp.file.name == "resources.bicep"
    assert deployment.outputs["AZURE_RESOURCE_GROUP"] == "rg-ci"
    assert len(deployment.outputs["AZURE_STAMPS"]) == 1
    # Stamp 0 hashes the same values into its names as a deployment without stamps did.
    assert resource_token(location="swedencentral") == ("<subscription>", "ci", "swedencentral")


def test_each_stamp_is_a_whole_deployment_in_a_group_of_its_own():
    deployed = deploy(stamps=3, stampLocations=["swedencentral", "westeurope"])
    groups = deployed.of_type(GROUP)
    assert [g.name for g in groups] == ["rg-ci", "rg-ci-stamp1", "rg-ci-stamp2"]
    # A stamp without an entry in stampLocations is in location.
    assert [g.body["location"] for g in groups] == ["swedencentral", "westeurope", "swedencentral"]
    stamps = deployed.modules["resources"]
    assert len(stamps) == 3
    single = deploy()
    (one,) = single.modules["resources"]

    def kinds(d: bicep.Deployment) -> list:
        return sorted(r.type for r in d.all_resources())

    for stamp in stamps:
        assert kinds(stamp) == kinds(one), "every stamp deploys everything one deployment does"
        assert len(stamp.of_type(NAMESPACE)) == 1 and len(stamp.of_type(SITE)) == 1


def test_every_stamp_gets_names_of_its_own():
    """Every name is made from resourceToken: stamp 0 keeps the values of a deployment
    without stamps; every other stamp adds its number, so two stamps in one region still get
    distinct names (of the same, valid, length: uniqueString is 13 characters whatever it hashes)."""
    tokens = [resource_token(location="swedencentral", stamp=n) for n in range(3)]
    assert tokens[0] == ("<subscription>", "ci", "swedencentral")
    assert tokens[1][-1] == "stamp-1" and tokens[2][-1] == "stamp-2"
    assert len(set(tokens)) == 3
    # main.bicep hands each stamp its number and its region.
    deployed = deploy(stamps=3, stampLocations=["swedencentral", "westeurope"])
    stamps = deployed.modules["resources"]
    assert [d.params["stamp"] for d in stamps] == [0, 1, 2]
    assert [d.params["location"] for d in stamps] == ["swedencentral", "westeurope", "swedencentral"]
    assert [d.outputs["AZURE_ORDERS_QUEUE_NAME"] for d in stamps] == ["orders"] * 3


def test_the_outputs_list_every_stamp_with_its_namespace_queue_and_api():
    deployed = deploy(stamps=2, stampLocations=["swedencentral", "norwayeast"])
    stamps = deployed.outputs["AZURE_STAMPS"]
    assert [s["stamp"] for s in stamps] == [0, 1]
    assert [s["resourceGroup"] for s in stamps] == ["rg-ci", "rg-ci-stamp1"]
    assert [s["location"] for s in stamps] == ["swedencentral", "norwayeast"]
    for entry in stamps:
        assert entry["ordersQueue"] == "orders"
        assert set(entry) == {"stamp", "resourceGroup", "location", "functionAppName", "storageAccountName",
                              "stateStorageAccountNames", "serviceBusNamespace", "ordersQueue", "apiUrl"}



def test_no_variable_holds_a_module_output():
    """Resource Manager resolves variables before any deployment runs, so a variable (a loop
    over the stamps included) cannot hold a stamp's outputs: only outputs and properties can."""
    template = bicep.template(MAIN.resolve())
    offending = [name for name, decl in template.vars.items() if ".outputs." in decl.node.text.decode()]
    assert not offending, offending


@pytest.mark.parametrize(("path", "name", "low", "high"), [(MAIN, "stamps", 1, 16), (RESOURCES, "stamp", 0, 15)])
def test_the_stamp_count_is_bounded_as_core_names_bounds_it(path, name, low, high):
    from core import names

    assert high == names.MAX_STAMPS - (name == "stamp")
    lines = path.read_text().splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith(f"param {name} ")]
    assert f"@minValue({low})" in lines[at - 4 : at] and f"@maxValue({high})" in lines[at - 4 : at]
