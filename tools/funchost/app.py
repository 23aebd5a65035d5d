"""Load a v2-model Function app by path and read what each function needs, as the Python worker does.

The worker imports ``function_app.py`` with the app directory on ``sys.path``, finds
the one ``FunctionApp`` instance at module level, indexes it with ``get_functions()``
(once: a second call raises a duplicate-name error) and checks every function's
parameters against its bindings. This module does the same and returns, per
function, a :class:`FunctionSpec`: the trigger and output bindings with their
``%SETTING%`` references resolved, and how to build each argument.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import azure.functions as func
from azure.functions import meta

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
    """The app could not be imported or indexed: no function can run."""


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


@dataclass(frozen=True)
class Param:
    """How to build one argument: the trigger value (``object``, ``str`` or ``bytes``), an Out, or the context."""

    name: str
    kind: str  # "trigger" | "out" | "context"
    form: str = "object"


@dataclass
class FunctionSpec:
    name: str
    function: func.Function
    user_function: Callable[..., Any]
    trigger: Binding
    outputs: list[Binding]
    params: list[Param]
    return_binding: Binding | None = None
    is_async: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def trigger_type(self) -> str:
        return self.trigger.type


def import_app(app_dir: Path, script: str = "function_app.py") -> Any:
    """Import ``function_app.py`` as the worker does and return its FunctionApp instance."""
    app_dir = app_dir.resolve()
    path = app_dir / script
    if not path.is_file():
        raise AppLoadError(f"no {script} in {app_dir}")
    if str(app_dir) not in sys.path:
        sys.path.insert(0, str(app_dir))
    module_name = path.stem
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(module_name, None)
        raise AppLoadError(f"importing {script} failed: {type(error).__name__}: {error}") from error
    apps = [value for value in vars(module).values() if isinstance(value, func.FunctionRegister)]
    if not apps:
        raise AppLoadError(f"{script} defines no FunctionApp instance at module level")
    if len({id(app) for app in apps}) > 1:
        raise AppLoadError(f"{script} defines more than one FunctionApp instance; the worker accepts exactly one")
    return apps[0]


def index_functions(app: Any) -> list[func.Function]:
    """``app.get_functions()``, called exactly once (a second call raises a duplicate-name error)."""
    # get_functions() warns through the root logger that auth levels only apply to HTTP
    # functions; that says nothing about a trigger-only app, so keep it out of the log.
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        return app.get_functions()
    except ValueError as error:
        raise AppLoadError(f"indexing the app failed: {error}") from error
    finally:
        logging.disable(previous)


def _bindings(function: func.Function) -> list[dict]:
    return json.loads(function.get_function_json())["bindings"]


def _type_hints(user_function: Callable) -> dict[str, Any]:
    try:
        return typing.get_type_hints(user_function)
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        return dict(getattr(user_function, "__annotations__", {}))


def _is_out(annotation: Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    return isinstance(origin, type) and issubclass(origin, func.Out)


def _trigger_form(name: str, binding_type: str, annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "object"
    if annotation in (str, bytes):
        return annotation.__name__
    converter = meta.get_binding_registry().get(binding_type)
    try:
        ok = converter is not None and converter.check_input_type_annotation(annotation)
    except TypeError:
        ok = False
    if not ok:
        shown = getattr(annotation, "__name__", repr(annotation))
        raise FunctionLoadError(
            name, f'type of binding "{binding_type}" does not match its Python annotation "{shown}"'
        )
    return "object"


def _check_out_annotation(name: str, param: str, binding_type: str, annotation: Any) -> None:
    args = typing.get_args(annotation)
    if len(args) != 1:
        raise FunctionLoadError(name, f"binding {param} has invalid Out annotation {annotation!r}")
    inner = args[0]
    if inner in (str, bytes, bytearray):
        return
    converter = meta.get_binding_registry().get(binding_type)
    try:
        ok = converter is not None and converter.check_output_type_annotation(inner)
    except TypeError:
        ok = False
    if not ok:
        shown = getattr(inner, "__name__", repr(inner))
        raise FunctionLoadError(name, f'binding {param} of type "{binding_type}" cannot take Out[{shown}]')


def build_spec(function: func.Function, environ: Mapping[str, str] | None = None) -> FunctionSpec:
    """Check one function as the worker does and resolve its bindings; raise FunctionLoadError if it can't run."""
    name = function.get_function_name()
    user_function = function.get_user_function()
    raw = _bindings(function)
    trigger: Binding | None = None
    outputs: list[Binding] = []
    by_name: dict[str, Binding] = {}
    for item in raw:
        try:
            properties = {key: resolve(value, environ) for key, value in item.items()}
        except ConfigError as error:
            raise FunctionLoadError(name, str(error)) from error
        binding = Binding(
            name=item["name"],
            type=item["type"],
            direction=str(item.get("direction", "")).upper(),
            properties=properties,
        )
        if binding.type.endswith("Trigger") or binding.type == "httpTrigger":
            trigger = binding
        elif binding.direction == "OUT":
            outputs.append(binding)
        else:
            raise FunctionLoadError(
                name, f'input binding "{binding.type}" ({binding.name}) is not supported by this host'
            )
        by_name[binding.name] = binding

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

    hints = _type_hints(user_function)
    signature = inspect.signature(user_function)
    declared = dict(signature.parameters)
    return_binding = by_name.pop("$return", None)
    if return_binding is not None and return_binding.direction != "OUT":
        raise FunctionLoadError(name, '"$return" binding must have direction set to "out"')

    params: list[Param] = []
    if "context" in declared and "context" not in by_name:
        params.append(Param("context", "context"))
        declared.pop("context")
    missing_in_bindings = set(declared) - set(by_name)
    if missing_in_bindings:
        raise FunctionLoadError(
            name,
            f"the following parameters are declared in Python but not in the bindings: {sorted(missing_in_bindings)}",
        )
    missing_in_python = set(by_name) - set(declared)
    if missing_in_python:
        raise FunctionLoadError(
            name, f"the following bindings are not parameters of the Python function: {sorted(missing_in_python)}"
        )

    for param_name in declared:
        binding = by_name[param_name]
        annotation = hints.get(param_name, inspect.Parameter.empty)
        if binding is trigger:
            if _is_out(annotation):
                raise FunctionLoadError(name, f"trigger binding {param_name} cannot be annotated azure.functions.Out")
            params.append(Param(param_name, "trigger", _trigger_form(name, trigger.type, annotation)))
        else:
            if annotation is not inspect.Parameter.empty:
                if not _is_out(annotation):
                    raise FunctionLoadError(
                        name,
                        f'binding {param_name} is declared to have the "out" direction, but its annotation '
                        "in Python is not a subclass of azure.functions.Out",
                    )
                _check_out_annotation(name, param_name, binding.type, annotation)
            params.append(Param(param_name, "out"))

    return FunctionSpec(
        name=name,
        function=function,
        user_function=user_function,
        trigger=trigger,
        outputs=outputs,
        params=params,
        return_binding=return_binding,
        is_async=inspect.iscoroutinefunction(user_function),
    )


def is_disabled(name: str, environ: Mapping[str, str]) -> bool:
    """``AzureWebJobs.<name>.Disabled`` = true switches a function off, as in Azure."""
    value = environ.get(f"AzureWebJobs.{name}.Disabled") or environ.get(f"AzureWebJobs_{name}_Disabled") or ""
    return value.strip().lower() in ("true", "1")
