"""The status API's protection in Azure: App Service Authentication (Easy Auth) on the
function app with the API's Entra ID app registration, the app setting API_AUTH that
makes the functions check the caller's app role, and anonymous HTTP functions behind
it. Without an app registration nothing trusts a caller: no Easy Auth, API_AUTH=disabled.
Offline, from the templates (tests/infra/bicep.py)."""

from __future__ import annotations

import pytest

from core import names
from core.access import ApiAuth
from tests.infra import bicep
from tests.infra.conftest import DEPLOY_PARAMS, MAIN, app_settings_of

CONFIG = "Microsoft.Web/sites/config"
#: Error orders by cause (api/search.py): the same API under /api/errors.
ERRORS_FUNCTIONS = {"list_errors", "get_error_group", "resubmit_error_group"}
API_FUNCTIONS = {"get_order", "list_orders", "resubmit_order", "cancel_order_api", "get_order_trace", "post_order_event"}
#: The operator page (api/ops.py): behind the same Easy Auth, with the same roles.
PAGE_FUNCTIONS = {"ops_page", "ops_asset", "ops_me", "ops_counts"}
#: The retention archive's reads (api/archive.py): same Easy Auth, same reader role.
ARCHIVE_FUNCTIONS = {"list_archived", "get_archived_order"}


def auth_configs(deployment: bicep.Deployment) -> list[bicep.Resource]:
    return [r for r in deployment.of_type(CONFIG) if r.name == "authsettingsV2"]


def test_easy_auth_admits_only_tokens_for_the_api_app_registration(deployment):
    (config,) = auth_configs(deployment)
    client_id = DEPLOY_PARAMS["apiClientId"]
    # On the function app the templates create.
    assert config.parent is not None and config.parent.type == "Microsoft.Web/sites" and config.parent.existing
    (site,) = deployment.of_type("Microsoft.Web/sites")
    assert config.parent.name == site.name  # the same 'func-${resourceToken}', through the module's output
    props = config.properties
    assert props["platform"] == {"enabled": True}
    assert props["globalValidation"] == {"requireAuthentication": True, "unauthenticatedClientAction": "Return401"}
    assert props["httpSettings"] == {"requireHttps": True}
    aad = props["identityProviders"]["azureActiveDirectory"]
    assert aad["enabled"] is True
    assert aad["registration"]["clientId"] == client_id
    issuer = aad["registration"]["openIdIssuer"]
    assert isinstance(issuer, bicep.Unknown)  # this tenant's, known at deployment
    assert "environment().authentication.loginEndpoint" in issuer.text and "tenant().tenantId" in issuer.text
    assert issuer.text.endswith("/v2.0'")
    assert aad["validation"]["allowedAudiences"] == [client_id, f"api://{client_id}"]
    assert "clientSecretSettingName" not in aad["registration"]  # bearer tokens only: no secret
    assert props["login"] == {"tokenStore": {"enabled": False}}
    # Only Entra ID: no other identity provider.
    assert set(props["identityProviders"]) == {"azureActiveDirectory"}


def test_the_functions_check_roles_behind_easy_auth(deployed_settings):
    assert deployed_settings[names.API_AUTH_SETTING] == ApiAuth.EASYAUTH.value


def test_without_an_app_registration_the_api_refuses_every_call():
    deployment = bicep.evaluate(MAIN, {**DEPLOY_PARAMS, "apiClientId": ""})
    assert auth_configs(deployment) == []
    assert app_settings_of(deployment)[names.API_AUTH_SETTING] == ApiAuth.DISABLED.value
    # And the parameter's default is that: azd passes an unset API_CLIENT_ID as ''.
    params = dict(DEPLOY_PARAMS)
    params.pop("apiClientId")
    default = bicep.evaluate(MAIN, params)
    assert auth_configs(default) == [] and app_settings_of(default)[names.API_AUTH_SETTING] == "disabled"


@pytest.mark.parametrize("client_id", ["", DEPLOY_PARAMS["apiClientId"]])
def test_no_deployment_turns_the_check_off(client_id):
    settings = app_settings_of(bicep.evaluate(MAIN, {**DEPLOY_PARAMS, "apiClientId": client_id}))
    assert settings[names.API_AUTH_SETTING] in {ApiAuth.EASYAUTH.value, ApiAuth.DISABLED.value}
    assert settings[names.API_AUTH_SETTING] != ApiAuth.NONE.value


def test_the_api_functions_are_anonymous_http_functions(function_bindings):
    http = {name: bindings for name, bindings in function_bindings.items()
            if any(b["type"] == "httpTrigger" for b in bindings)}
    assert set(http) == API_FUNCTIONS | ERRORS_FUNCTIONS | PAGE_FUNCTIONS | ARCHIVE_FUNCTIONS
    for name, bindings in http.items():
        (trigger,) = [b for b in bindings if b["type"] == "httpTrigger"]
        # Easy Auth authenticates; a function key would only add a shared secret to leak.
        assert trigger["authLevel"] == "ANONYMOUS", name
        prefix = (
            "ops" if name in PAGE_FUNCTIONS else "errors" if name in ERRORS_FUNCTIONS
            else "archive" if name in ARCHIVE_FUNCTIONS else "orders"
        )
        assert trigger["route"].startswith(prefix), name
