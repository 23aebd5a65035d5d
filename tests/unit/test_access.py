"""Who may call the status API (core/access.py): the principal header App Service
Authentication passes, and the decision for each mode of API_AUTH."""

from __future__ import annotations

import base64
import json

import pytest

from core.access import (
    OPERATE_ROLES,
    OPERATOR_ROLE,
    PRINCIPAL_HEADER,
    READ_ROLES,
    READER_ROLE,
    ApiAuth,
    BadPrincipal,
    Principal,
    check,
)


def header(claims: list[dict], *, role_typ: str | None = "roles", name_typ: str = "name") -> str:
    """An X-MS-CLIENT-PRINCIPAL value, as documented for App Service authentication."""
    document = {"auth_typ": "aad", "claims": claims, "name_typ": name_typ}
    if role_typ is not None:
        document["role_typ"] = role_typ
    return base64.b64encode(json.dumps(document).encode()).decode()


def caller(*roles: str) -> dict[str, str]:
    claims = [{"typ": "name", "val": "ops@example.test"}, *({"typ": "roles", "val": r} for r in roles)]
    return {PRINCIPAL_HEADER: header(claims)}


def test_the_principal_header_gives_the_roles_and_the_name():
    principal = Principal.from_header(caller(READER_ROLE, "Other.Role")[PRINCIPAL_HEADER])
    assert principal == Principal("aad", "ops@example.test", frozenset({READER_ROLE, "Other.Role"}))


def test_role_claims_follow_role_typ_else_the_known_claim_types():
    long_type = "http://schemas.microsoft.com/ws/2008/06/identity/claims/role"
    custom = header(
        [{"typ": "my-roles", "val": OPERATOR_ROLE}, {"typ": "roles", "val": READER_ROLE}], role_typ="my-roles"
    )
    assert Principal.from_header(custom).roles == {OPERATOR_ROLE}
    unnamed = header([{"typ": long_type, "val": OPERATOR_ROLE}, {"typ": "roles", "val": READER_ROLE}], role_typ=None)
    assert Principal.from_header(unnamed).roles == {OPERATOR_ROLE, READER_ROLE}


@pytest.mark.parametrize(
    "value",
    ["not base64!", base64.b64encode(b"not json").decode(), base64.b64encode(b"[1, 2]").decode(),
     base64.b64encode(b'{"claims": "x"}').decode()],
)
def test_a_malformed_principal_is_refused(value):
    with pytest.raises(BadPrincipal):
        Principal.from_header(value)


def test_easyauth_needs_a_caller_with_one_of_the_roles():
    assert check(ApiAuth.EASYAUTH, caller(READER_ROLE), READ_ROLES) is None
    assert check(ApiAuth.EASYAUTH, caller(OPERATOR_ROLE), READ_ROLES) is None  # an operator may read
    assert check(ApiAuth.EASYAUTH, caller(OPERATOR_ROLE), OPERATE_ROLES) is None

    reader_resubmits = check(ApiAuth.EASYAUTH, caller(READER_ROLE), OPERATE_ROLES)
    assert (reader_resubmits.status, reader_resubmits.error) == (403, "forbidden")
    assert OPERATOR_ROLE in reader_resubmits.reason
    assert check(ApiAuth.EASYAUTH, caller(), READ_ROLES).status == 403
    assert check(ApiAuth.EASYAUTH, caller("Orders.read"), READ_ROLES).status == 403  # role values are exact

    anonymous = check(ApiAuth.EASYAUTH, {}, READ_ROLES)
    assert (anonymous.status, anonymous.error) == (401, "unauthorized")
    forged = check(ApiAuth.EASYAUTH, {PRINCIPAL_HEADER: "garbage"}, READ_ROLES)
    assert forged.status == 401


def test_none_lets_every_call_through_and_disabled_refuses_every_call():
    assert check(ApiAuth.NONE, {}, OPERATE_ROLES) is None
    for headers in ({}, caller(OPERATOR_ROLE)):
        denial = check(ApiAuth.DISABLED, headers, READ_ROLES)
        assert (denial.status, denial.error) == (403, "forbidden") and "API_AUTH" in denial.reason


def test_easyauth_trusts_no_header_while_app_service_says_its_authentication_is_off():
    """With Easy Auth off nothing strips a header a client forged: where App Service says so
    (WEBSITE_AUTH_ENABLED), no call goes through whatever its header claims."""
    forged = caller(OPERATOR_ROLE)
    assert check(ApiAuth.EASYAUTH, forged, OPERATE_ROLES, platform_auth="True") is None
    assert check(ApiAuth.EASYAUTH, forged, OPERATE_ROLES, platform_auth="true") is None
    assert check(ApiAuth.EASYAUTH, forged, OPERATE_ROLES, platform_auth=None) is None  # not said: the setting rules
    for off in ("False", "false", ""):
        denial = check(ApiAuth.EASYAUTH, forged, READ_ROLES, platform_auth=off)
        assert (denial.status, denial.error) == (403, "forbidden") and "Authentication is off" in denial.reason


@pytest.mark.parametrize("host", ["127.0.0.1:7071", "localhost:7071", "LOCALHOST", "[::1]:7071", "127.0.0.2", "::1"])
def test_none_answers_a_loopback_host(host):
    assert check(ApiAuth.NONE, {"host": host}, OPERATE_ROLES) is None


@pytest.mark.parametrize("host", ["rebind.attacker.example:7071", "10.0.0.5:7071", "127.0.0.1.evil.example", "[::2]:7071"])
def test_none_refuses_a_host_that_is_not_loopback_dns_rebinding(host):
    """A page of another site whose name was made to resolve to 127.0.0.1 calls the local
    stack with its own name as Host (and as Origin): refused."""
    denial = check(ApiAuth.NONE, {"host": host, "origin": f"http://{host}"}, READ_ROLES)
    assert (denial.status, denial.error) == (403, "forbidden") and "loopback" in denial.reason
