"""Shared fixtures for the infra tests: the evaluated deployment and the app's bindings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from core.workflow import remotes
from tests import ROOT
from tests.infra import bicep

INFRA = ROOT / "infra"
MAIN = INFRA / "main.bicep"


def url_parameter(remote: str) -> str:
    """The main.bicep parameter with a remote service's base URL: ``inventory`` ->
    ``remoteInventoryUrl`` (for the app setting ``REMOTE_INVENTORY_URL``)."""
    return f"remote{remote[:1].upper()}{remote[1:]}Url"


def remote_url(remote: str) -> str:
    """The made-up base URL the tests deploy for a remote service."""
    return f"https://{remote}.example.test"


def _declared_url_parameters() -> set[str]:
    # A remote of core.workflow whose parameter main.bicep lacks is left out here, so
    # the other tests still run; test_app_consistency reports the missing parameter.
    try:
        declared = bicep.template(MAIN.resolve()).params
    except (OSError, bicep.BicepError):
        return set()  # test_bicep_file_parses reports it
    return {url_parameter(remote) for remote in remotes()} & set(declared)


_URL_PARAMETERS = _declared_url_parameters()

#: Parameters as `azd up` would pass them (values are made up; none is a secret): one
#: base-URL parameter per remote service of core.workflow.
DEPLOY_PARAMS = {
    "environmentName": "ci",
    "location": "swedencentral",
    **{url_parameter(r): remote_url(r) for r in remotes() if url_parameter(r) in _URL_PARAMETERS},
    "alertEmail": "operator@example.test",
    # The status API's app registration (docs/deploy.md); a made-up client id.
    "apiClientId": "11111111-2222-3333-4444-555555555555",
}
#: A deploying developer's object id, to check the roles principalId grants.
DEVELOPER_ID = "00000000-1111-2222-3333-444444444444"


def bicep_files() -> list[Path]:
    return sorted(INFRA.rglob("*.bicep"))


@pytest.fixture(scope="session")
def deployment() -> bicep.Deployment:
    """main.bicep evaluated as CI would deploy it: no developer principal."""
    return bicep.evaluate(MAIN, DEPLOY_PARAMS)


@pytest.fixture(scope="session")
def deployment_with_developer() -> bicep.Deployment:
    return bicep.evaluate(MAIN, {**DEPLOY_PARAMS, "principalId": DEVELOPER_ID})


def app_settings_of(deployment: bicep.Deployment) -> dict:
    configs = [r for r in deployment.of_type("Microsoft.Web/sites/config") if r.name == "appsettings"]
    assert len(configs) == 1, f"expected one appsettings config, found {configs}"
    settings = configs[0].properties
    assert isinstance(settings, dict), f"app settings are not a plain object: {settings}"
    return settings


@pytest.fixture(scope="session")
def deployed_settings(deployment) -> dict:
    return app_settings_of(deployment)


def names_of(deployment: bicep.Deployment, resource_type: str) -> set:
    return {r.name for r in deployment.of_type(resource_type)}


@pytest.fixture(scope="session")
def function_bindings() -> dict[str, list[dict]]:
    """Every function in function_app.py with its bindings, as the Functions host reads them.

    function_app.py is loaded as a fresh module (not ``import function_app``), so this
    app object is ours: ``get_functions()`` may be called only once per FunctionApp.
    """
    path = ROOT / "function_app.py"
    if not path.exists():
        pytest.fail("function_app.py is missing: the infrastructure cannot be checked against the app")
    spec = importlib.util.spec_from_file_location("_infra_check_function_app", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT))
    return {
        fn.get_function_name(): [json.loads(raw) for raw in fn.get_raw_bindings()]
        for fn in module.app.get_functions()
    }
