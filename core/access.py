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
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from enum import Enum

#: App roles of the API's Entra ID app registration (docs/deploy.md creates them).
READER_ROLE = "Orders.Read"
OPERATOR_ROLE = "Orders.Operate"
#: The roles that grant each kind of call.
READ_ROLES = frozenset({READER_ROLE, OPERATOR_ROLE})
OPERATE_ROLES = frozenset({OPERATOR_ROLE})

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


def check(mode: ApiAuth, headers: dict[str, str] | None, allowed: frozenset[str]) -> Denial | None:
    """None if the call may go on; else why not. ``headers`` have lower-cased names."""
    if mode is ApiAuth.NONE:
        return None
    if mode is ApiAuth.DISABLED:
        return Denial(403, "forbidden", "the status API is not enabled in this deployment (app setting API_AUTH)")
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

