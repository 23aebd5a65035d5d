"""Indexing functions as the Python worker does: bindings from get_functions(), parameters checked."""

from __future__ import annotations

import azure.functions as func
import pytest

from tools.funchost.app import FunctionLoadError, build_spec, index_functions, is_disabled

ENV = {"Q": "orders", "CONN": "ServiceBusConnection"}


def one_function(register) -> func.Function:
    app = func.FunctionApp()
    register(app)
    (function,) = index_functions(app)
    return function


def test_bindings_are_resolved_and_arguments_planned():
    def register(app):
        @app.function_name("submit")
        @app.service_bus_queue_trigger(arg_name="msg", queue_name="%Q%", connection="ServiceBusConnection")
        @app.queue_output(arg_name="nudge", queue_name="%Q%-nudges", connection="AzureWebJobsStorage")
        def handler(msg: func.ServiceBusMessage, nudge: func.Out[str], context: func.Context) -> None: ...

    spec = build_spec(one_function(register), ENV)
    assert spec.name == "submit"
    assert spec.trigger.type == "serviceBusTrigger" and spec.trigger.queue_name == "orders"
    assert [(o.name, o.type, o.queue_name) for o in spec.outputs] == [("nudge", "queue", "orders-nudges")]
    assert {(p.name, p.kind, p.form) for p in spec.params} == {
        ("msg", "trigger", "object"),
        ("nudge", "out", "object"),
        ("context", "context", "object"),
    }
    assert not spec.is_async


def test_return_outputs_async_functions_and_body_annotations():
    def register(app):
        @app.queue_trigger(arg_name="body", queue_name="in", connection="AzureWebJobsStorage")
        @app.queue_output(arg_name="$return", queue_name="out", connection="AzureWebJobsStorage")
        async def handler(body: str) -> str: ...

    spec = build_spec(one_function(register), ENV)
    assert spec.is_async
    assert spec.return_binding is not None and spec.return_binding.queue_name == "out"
    assert [(p.name, p.form) for p in spec.params] == [("body", "str")]


def test_an_http_function_has_its_response_as_an_http_output():
    def register(app):
        @app.route(route="orders/{id}", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
        def get_order(req: func.HttpRequest) -> func.HttpResponse: ...

    spec = build_spec(one_function(register), ENV)
    assert spec.trigger.type == "httpTrigger" and spec.trigger.get("route") == "orders/{id}"
    assert spec.trigger.get("methods") == ["GET"]
    assert [(o.name, o.type) for o in spec.outputs] == [("$return", "http")]
    assert [(p.name, p.kind, p.form) for p in spec.params] == [("req", "trigger", "object")]


def test_a_second_get_functions_call_is_what_the_host_avoids():
    app = func.FunctionApp()

    @app.timer_trigger(arg_name="timer", schedule="*/5 * * * * *")
    def tick(timer: func.TimerRequest) -> None: ...

    assert len(index_functions(app)) == 1
    with pytest.raises(Exception, match="unique"):
        app.get_functions()


@pytest.mark.parametrize(
    "register, message",
    [
        (
            lambda app: app.queue_trigger(arg_name="msg", queue_name="q", connection="c")(lambda msg, extra: None),
            "declared in Python but not in the bindings",
        ),
        (
            lambda app: app.queue_trigger(arg_name="msg", queue_name="%NOT_SET%", connection="c")(lambda msg: None),
            "'%NOT_SET%' does not resolve",
        ),
        (
            lambda app: app.blob_trigger(arg_name="blob", path="c/{name}", connection="c")(lambda blob: None),
            'trigger "blobTrigger" is not supported',
        ),
    ],
)
def test_functions_this_host_cannot_run_are_reported_by_name(register, message):
    with pytest.raises(FunctionLoadError, match=message):
        build_spec(one_function(register), ENV)


def test_annotation_mismatches_fail_as_in_the_worker():
    def wrong_trigger(app):
        @app.queue_trigger(arg_name="msg", queue_name="q", connection="c")
        def handler(msg: int) -> None: ...

    def out_without_out(app):
        @app.queue_trigger(arg_name="msg", queue_name="q", connection="c")
        @app.queue_output(arg_name="out", queue_name="o", connection="c")
        def handler(msg: func.QueueMessage, out: str) -> None: ...

    def bad_out_type(app):
        @app.queue_trigger(arg_name="msg", queue_name="q", connection="c")
        @app.service_bus_queue_output(arg_name="out", queue_name="o", connection="c")
        def handler(msg: func.QueueMessage, out: func.Out[dict]) -> None: ...

    with pytest.raises(FunctionLoadError, match='does not match its Python annotation "int"'):
        build_spec(one_function(wrong_trigger), ENV)
    with pytest.raises(FunctionLoadError, match="not a subclass of azure.functions.Out"):
        build_spec(one_function(out_without_out), ENV)
    with pytest.raises(FunctionLoadError, match=r"cannot take Out\[dict\]"):
        build_spec(one_function(bad_out_type), ENV)


def test_disabled_setting_as_in_azure():
    assert is_disabled("tick", {"AzureWebJobs.tick.Disabled": "true"})
    assert is_disabled("tick", {"AzureWebJobs.tick.Disabled": "1"})
    assert is_disabled("tick", {"AzureWebJobs_tick_Disabled": "True"})  # where a name may not hold dots
    assert not is_disabled("tick", {"AzureWebJobs.tick.Disabled": "false"})
    assert not is_disabled("tick", {})
