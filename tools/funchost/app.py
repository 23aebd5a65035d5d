"""What the host makes of each function the worker indexed: its trigger and outputs, settings resolved.

The worker (Microsoft's ``azure-functions-runtime``) imports ``function_app.py``, indexes it
and checks each function's parameters against its bindings; it answers the host's
``FunctionsMetadataRequest`` with every function's id, name and raw bindings (the JSON of
function.json). This module reads those bindings as the Functions host does: ``%SETTING%``
references resolved from the app settings, the trigger told apart from the outputs, the
connection each binding uses, and whether this host can run the function at all (a trigger
or binding it does not emulate puts that one function "in error"; the others run, as in Azure).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import ConfigError, resolve

log = logging.getLogger("funchost")

SERVICE_BUS_TRIGGER = "serviceBusTrigger"
QUEUE_TRIGGER = "queueTrigger"
TIMER_TRIGGER = "timerTrigger"
HTTP_TRIGGER = "httpTrigger"
SUPPORTED_TRIGGERS = (SERVICE_BUS_TRIGGER, QUEUE_TRIGGER, TIMER_TRIGGER, HTTP_TRIGGER)
QUEUE_OUTPUT = "queue"
SERVICE_BUS_OUTPUT = "serviceBus"
#: An HTTP trigger's response (``@app.route`` adds it as ``$return``).
HTTP_OUTPUT = "http"
SUPPORTED_OUTPUTS = (QUEUE_OUTPUT, SERVICE_BUS_OUTPUT, HTTP_OUTPUT)

#: The connection setting a binding uses when it names none (as in the Functions host).
DEFAULT_CONNECTIONS = {
    SERVICE_BUS_TRIGGER: "AzureWebJobsServiceBus",
    SERVICE_BUS_OUTPUT: "AzureWebJobsServiceBus",
    QUEUE_TRIGGER: "AzureWebJobsStorage",
    QUEUE_OUTPUT: "AzureWebJobsStorage",
}


class AppLoadError(RuntimeError):
    """The app could not be indexed: no function can run."""


class FunctionLoadError(RuntimeError):
    """One function cannot run on this host; the others still do (as in the Functions host)."""

    def __init__(self, function_name: str, message: str):
        super().__init__(f"cannot load the {function_name} function: {message}")
        self.function_name = function_name


@dataclass(frozen=True)
class Binding:
    """One binding with its properties as in function.json, ``%SETTING%`` already resolved."""

    name: str
    type: str
    direction: str
    properties: Mapping[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        return self.properties.get(key, default)

    @property
    def connection(self) -> str:
        return self.get("connection") or DEFAULT_CONNECTIONS.get(self.type, "AzureWebJobsStorage")

    @property
    def queue_name(self) -> str:
        return self.get("queueName")

    @property
    def binary(self) -> bool:
        """``dataType: binary`` (or ``stream``): the trigger's data goes to the worker as bytes, else as a string."""
        return str(self.get("dataType") or "").lower() in ("binary", "stream")


@dataclass
class FunctionSpec:
    """A function the host runs: its worker-assigned id, its trigger and its outputs."""

    name: str
    function_id: str
    trigger: Binding
    outputs: list[Binding]

    @property
    def trigger_type(self) -> str:
        return self.trigger.type


def build_spec(name: str, function_id: str, raw_bindings: list[str],
               environ: Mapping[str, str] | None = None) -> FunctionSpec:
    """Read one indexed function's bindings; raise FunctionLoadError if this host cannot run it."""
    trigger: Binding | None = None
    outputs: list[Binding] = []
    for raw in raw_bindings:
        item = json.loads(raw)
        try:
            properties = {key: resolve(value, environ) for key, value in item.items()}
        except ConfigError as error:
            raise FunctionLoadError(name, str(error)) from error
        binding = Binding(
            name=item["name"], type=item["type"], direction=str(item.get("direction", "")).upper(),
            properties=properties,
        )
        if binding.type.endswith("Trigger"):
            trigger = binding
        elif binding.direction == "OUT":
            outputs.append(binding)
        else:
            raise FunctionLoadError(
                name, f'input binding "{binding.type}" ({binding.name}) is not supported by this host'
            )

    if trigger is None:
        raise FunctionLoadError(name, "no trigger")
    if trigger.type not in SUPPORTED_TRIGGERS:
        raise FunctionLoadError(name, f'trigger "{trigger.type}" is not supported by this host')
    for output in outputs:
        if output.type not in SUPPORTED_OUTPUTS:
            raise FunctionLoadError(
                name, f'output binding "{output.type}" ({output.name}) is not supported by this host'
            )
        if output.type == HTTP_OUTPUT:
            if trigger.type != HTTP_TRIGGER:
                raise FunctionLoadError(name, f"output binding {output.name}: an http output needs an HTTP trigger")
            continue
        if output.get("topicName") or not output.queue_name:
            raise FunctionLoadError(name, f"output binding {output.name}: only queues are supported, not topics")
    if trigger.type == SERVICE_BUS_TRIGGER:
        if trigger.get("topicName") or not trigger.queue_name:
            raise FunctionLoadError(name, "Service Bus topic triggers are not supported by this host, only queues")
        if trigger.get("isSessionsEnabled"):
            raise FunctionLoadError(name, "session-enabled Service Bus triggers are not supported by this host")
        if str(trigger.get("cardinality", "one")).lower() == "many":
            raise FunctionLoadError(name, 'cardinality "many" (batches) is not supported by this host')
    if trigger.type == QUEUE_TRIGGER and not trigger.queue_name:
        raise FunctionLoadError(name, "queue trigger without queueName")
    if trigger.type == HTTP_TRIGGER and sum(1 for output in outputs if output.type == HTTP_OUTPUT) > 1:
        raise FunctionLoadError(name, "more than one http output binding")
    return FunctionSpec(name=name, function_id=function_id, trigger=trigger, outputs=outputs)


def is_disabled(name: str, environ: Mapping[str, str]) -> bool:
    """``AzureWebJobs.<name>.Disabled`` = true switches a function off, as in Azure."""
    value = environ.get(f"AzureWebJobs.{name}.Disabled") or environ.get(f"AzureWebJobs_{name}_Disabled") or ""
    return value.strip().lower() in ("true", "1")
