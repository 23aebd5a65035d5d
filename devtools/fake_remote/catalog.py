"""The services one fake serves and their actions: ``{service: {action: compensation or None}}``.

Service ``NAME`` is served under ``{url}/{NAME}``; each of its actions and compensations
is ``POST {url}/{NAME}/{action}``. A forward action names the compensation that undoes
it (or None: it cannot be undone); a compensation is a route of its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from devtools.fake_remote.faults import FaultConfigError

#: The order workflow's services (the app's ``core/workflow.py``): used when none are given.
DEFAULT_SERVICES: dict[str, dict[str, str | None]] = {
    "inventory": {"reserve": "release"},
    "payments": {"charge": "refund"},
    "shipping": {"ship": None},
}

#: Service and action names are URL path segments; a leading letter keeps ``/_control`` free.
#: Services that answer ``GET {url}/{service}/{action}/{idempotency key}`` (200 with the
#: first result if that key was applied for that action, 404 if not), as
#: core.workflow declares with ``lookup=True``; shipping offers none.
DEFAULT_LOOKUPS: frozenset[str] = frozenset({"inventory", "payments"})

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")

ACTION = "action"
COMPENSATION = "compensation"


@dataclass(frozen=True)
class Service:
    name: str
    #: forward action -> its compensation (None: cannot be undone)
    actions: Mapping[str, str | None]
    #: compensation -> the forward actions it undoes
    compensations: Mapping[str, tuple[str, ...]]

    @property
    def routes(self) -> frozenset[str]:
        return frozenset(self.actions) | frozenset(self.compensations)

    def kind_of(self, route: str) -> str | None:
        """``"action"``, ``"compensation"``, or None for a route this service does not have."""
        if route in self.actions:
            return ACTION
        if route in self.compensations:
            return COMPENSATION
        return None

    def as_mapping(self) -> dict[str, str | None]:
        return dict(self.actions)


def validate_services(services: Mapping[str, Any] | None) -> dict[str, Service]:
    """The services, checked; ``None`` gives :data:`DEFAULT_SERVICES`."""
    if services is None:
        services = DEFAULT_SERVICES
    if not isinstance(services, Mapping) or not services:
        raise FaultConfigError(
            "services must be a non-empty object of service -> {action: compensation or null}, "
            f"got {services!r}"
        )
    checked: dict[str, Service] = {}
    for name, actions in services.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise FaultConfigError(f"service name {name!r} must be lower-case letters, digits, '-' or '_', starting with a letter")
        if not isinstance(actions, Mapping) or not actions:
            raise FaultConfigError(f"service {name!r}: its actions must be a non-empty object of action -> compensation or null")
        compensations: dict[str, list[str]] = {}
        for action, compensation in actions.items():
            for what, value in (("action", action), ("compensation", compensation)):
                if value is None and what == "compensation":
                    continue
                if not isinstance(value, str) or not _NAME.match(value):
                    raise FaultConfigError(
                        f"service {name!r}: {what} name {value!r} must be lower-case letters, digits, '-' or '_', "
                        "starting with a letter"
                    )
            if compensation is None:
                continue
            if compensation in actions:
                raise FaultConfigError(
                    f"service {name!r}: {compensation!r} is both a forward action and the compensation of {action!r}"
                )
            compensations.setdefault(compensation, []).append(action)
        checked[name] = Service(
            name, dict(actions), {comp: tuple(undoes) for comp, undoes in compensations.items()}
        )
    return checked
