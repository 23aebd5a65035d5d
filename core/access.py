"""Who may call the status API: the app roles, the ways the app can be told who calls,
and the decision for one request. Pure: no I/O, no Azure package.

In Azure, App Service Authentication ("Easy Auth", infra/app/api-auth.bicep) validates
the caller's Entra ID token before the function runs and hands the function the
caller's claims in the ``X-MS-CLIENT-PRINCIPAL`` header: base64 of a JSON object
``{"auth_typ", "claims": [{"typ", "val"}], "name_typ", "role_typ"}``. App Service sets
that header itself and drops one a client sends, so it can be trusted only where Easy
Auth runs. The function then checks the caller's app roles (the ``roles`` claims):
:data:`READER_ROLE` to read, :data:`OPERATOR_ROLE` to resubmit (an operator may read too).

The app setting ``API_AUTH`` says which applies (:class:`ApiAuth`): ``easyauth`` (roles
from the header, as above), ``none`` (no check at all: the local stack, where the local
host listens on loopback only), or ``disabled`` (every call refused: the default, so an
app deployed without Easy Auth never trusts a header a client could forge).

Two more checks keep those promises when the setting and the platform disagree:

- ``easyauth`` while App Service says Easy Auth is off (``WEBSITE_AUTH_ENABLED``, which App
  Service sets for the app; Microsoft.Identity.Web reads it the same way,
  ``AppServicesAuthenticationInformation``): nothing strips a forged header then, so
  every call is refused. Where the platform does not set the variable at all, the setting
  is all there is to go by.
- ``none`` with a ``Host`` that is not a loopback name: a page of another site that made
  its own name resolve to 127.0.0.1 (DNS rebinding) would otherwise reach the local stack,
  its ``Origin`` and ``Host`` alike; refused.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from core.models import without_control_characters

#: App roles of the API's Entra ID app registration (docs/deploy.md creates them).
READER_ROLE = "Orders.Read"
OPERATOR_ROLE = "Orders.Operate"
#: The roles that grant each kind of call.
READ_ROLES = frozenset({READER_ROLE, OPERATOR_ROLE})
OPERATE_ROLES = frozenset({OPERATOR_ROLE})

#: What App Service sets to say whether Easy Auth is on for the app ("True" when it is).
PLATFORM_AUTH_SETTING = "WEBSITE_AUTH_ENABLED"
#: The header App Service Authentication passes to the app (lower-cased, as the worker hands it).
PRINCIPAL_HEADER = "x-ms-client-principal"
#: Claim types that carry an app role when the principal names none (``role_typ``).
_ROLE_CLAIM_TYPES = ("roles", "http://schemas.microsoft.com/ws/2008/06/identity/claims/role")


class ApiAuth(str, Enum):
    """The app setting ``API_AUTH``."""

    EASYAUTH = "easyauth"
    NONE = "none"
    DISABLED = "disabled"


class BadPrincipal(ValueError):
    """The principal header is not base64 JSON of the documented shape."""


@dataclass(frozen=True)
class Principal:
    """The caller as App Service Authentication describes it."""

    identity_provider: str
    name: str | None
    roles: frozenset[str]

    @classmethod
    def from_header(cls, value: str) -> Principal:
        try:
            decoded = json.loads(base64.b64decode(value.strip(), validate=True))
        except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError) as error:
            raise BadPrincipal("the client principal header is not base64-encoded JSON") from error
        if not isinstance(decoded, dict) or not isinstance(decoded.get("claims"), list):
            raise BadPrincipal("the client principal header has no claims")
        role_type = decoded.get("role_typ")
        name_type = decoded.get("name_typ")
        role_types = {role_type} if isinstance(role_type, str) and role_type else set(_ROLE_CLAIM_TYPES)
        roles, name = set(), None
        for claim in decoded["claims"]:
            if not isinstance(claim, dict) or not all(isinstance(claim.get(key), str) for key in ("typ", "val")):
                continue
            if claim.get("typ") in role_types:
                roles.add(claim["val"])
            elif name is None and claim.get("typ") == name_type:
                name = claim["val"]
        return cls(str(decoded.get("auth_typ") or ""), name, frozenset(roles))


@dataclass(frozen=True)
class Denial:
    """Why a call is refused: an HTTP status (401 or 403) and a reason for the caller."""

    status: int
    error: str
    reason: str


def check(
    mode: ApiAuth, headers: dict[str, str] | None, allowed: frozenset[str], *, platform_auth: str | None = None
) -> Denial | None:
    """None if the call may go on; else why not. ``headers`` have lower-cased names;
    ``platform_auth``: the value of ``WEBSITE_AUTH_ENABLED`` (None where it is not set)."""
    if mode is ApiAuth.NONE:
        host = (headers or {}).get("host")
        if host is not None and not loopback_host(host):
            return Denial(403, "forbidden", "API_AUTH=none answers calls to a loopback address only (localhost, 127.0.0.1, ::1)")
        return None
    if mode is ApiAuth.DISABLED:
        return Denial(403, "forbidden", "the status API is not enabled in this deployment (app setting API_AUTH)")
    if platform_auth is not None and platform_auth.strip().lower() != "true":
        return Denial(
            403, "forbidden",
            "API_AUTH=easyauth, but App Service Authentication is off for this app: no caller can be trusted",
        )
    value = (headers or {}).get(PRINCIPAL_HEADER)
    if not value:
        return Denial(401, "unauthorized", "no authenticated caller: call with an Entra ID token for this API")
    try:
        principal = Principal.from_header(value)
    except BadPrincipal as error:
        return Denial(401, "unauthorized", str(error))
    if not principal.roles & allowed:
        wanted = " or ".join(sorted(allowed))
        return Denial(403, "forbidden", f"the caller has no app role {wanted}")
    return None



def loopback_host(host: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback: ``localhost``, an address
    of 127.0.0.0/8 or ``::1``, with or without a port."""
    name = host.strip().lower()
    if name.startswith("["):  # [::1]:7071
        name = name[1:].split("]", 1)[0]
    elif name.count(":") == 1:  # 127.0.0.1:7071, localhost:7071
        name = name.split(":", 1)[0]
    if name in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def signed_in(mode: ApiAuth, headers: Mapping[str, str]) -> str | None:
    """The caller's name as App Service Authentication gives it (control characters taken
    out, at most 200 characters), for what a call records as done by whom (a cancel, an
    approval); None without Easy Auth, or when the principal names no one."""
    if mode is not ApiAuth.EASYAUTH:
        return None
    lowered = {key.lower(): value for key, value in headers.items()}
    try:
        name = Principal.from_header(lowered.get(PRINCIPAL_HEADER, "")).name
    except BadPrincipal:
        return None
    return (without_control_characters(name)[:200] or None) if name else None
