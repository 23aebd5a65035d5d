"""Shared fixtures for the infra tests: the evaluated deployment and the app's bindings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.infra import bicep

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MAIN = INFRA / "main.bicep"

#: Parameters as `azd up` would pass them (values are made up; none is a secret).
DEPLOY_PARAMS = {
    "environmentName": "ci",
    "location": "swedencentral",
    "remoteServiceUrl": "https://remote.example.test",
    "alertEmail": "operator@example.test",
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
