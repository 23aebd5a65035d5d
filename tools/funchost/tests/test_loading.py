"""The host's reading of each function the worker indexed: raw bindings, settings resolved, what it can run.

The raw bindings here are what ``azure.functions`` makes of a decorated function
(``get_raw_bindings()``), as Microsoft's runtime sends them in ``FunctionMetadataResponse``.
"""

from __future__ import annotations

import azure.functions as func
import pytest

from tools.funchost.app import FunctionLoadError, build_spec, is_disabled

ENV = {"Q": "orders", "CONN": "ServiceBusConnection"}


def spec_of(register, environ=ENV):
    app = func.FunctionApp()
    register(app)
    (function,) = app.get_functions()
    return build_spec(function.get_function_name(), "id-1", function.get_raw_bindings(), environ)


def test_the_trigger_and_outputs_with_their_settings_resolved():
    def register(app):
        @app.function_name("submit")
        @app.service_bus_queue_trigger(arg_name="msg", queue_name="%Q%", connection="ServiceBusConnection")
        @app.queue_output(arg_name="nudge", queue_name="%Q%-nudges", connection="AzureWebJobsStorage")
        def handler(msg: func.ServiceBusMessage, nudge: func.Out[str], context: func.Context) -> None: ...

    spec = spec_of(register)
    assert (spec.name, spec.function_id) == ("submit", "id-1")
    assert spec.trigger.type == "serviceBusTrigger" and spec.trigger.queue_name == "orders"
    assert spec.trigger.connection == "ServiceBusConnection"
    assert [(o.name, o.type, o.queue_name) for o in spec.outputs] == [("nudge", "queue", "orders-nudges")]


def test_a_return_output_and_the_binary_data_type():
    def register(app):
        @app.queue_trigger(arg_name="body", queue_name="in", connection="AzureWebJobsStorage", data_type="binary")
        @app.queue_output(arg_name="$return", queue_name="out", connection="AzureWebJobsStorage")
        async def handler(body: bytes) -> str: ...

    spec = spec_of(register)
    assert spec.trigger.binary
    assert [(o.name, o.queue_name) for o in spec.outputs] == [("$return", "out")]


def test_an_http_function_has_its_response_as_an_http_output():
    def register(app):
        @app.route(route="orders/{id}", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
        def get_order(req: func.HttpRequest) -> func.HttpResponse: ...

    spec = spec_of(register)
    assert spec.trigger.type == "httpTrigger" and spec.trigger.get("route") == "orders/{id}"
    assert spec.trigger.get("methods") == ["GET"]
    assert [(o.name, o.type) for o in spec.outputs] == [("$return", "http")]


@pytest.mark.parametrize(
    "register, message",
    [
        (
            lambda app: app.queue_trigger(arg_name="msg", queue_name="%NOT_SET%", connection="c")(lambda msg: None),
            "'%NOT_SET%' does not resolve",
        ),
        (
            lambda app: app.blob_trigger(arg_name="blob", path="c/{name}", connection="c")(lambda blob: None),
            'trigger "blobTrigger" is not supported',
        ),
        (
            lambda app: app.service_bus_topic_trigger(
                arg_name="msg", topic_name="t", subscription_name="s", connection="c")(lambda msg: None),
            "topic triggers are not supported",
        ),
    ],
)
def test_functions_this_host_cannot_run_are_reported_by_name(register, message):
    with pytest.raises(FunctionLoadError, match=message):
        spec_of(register)


def test_disabled_setting_as_in_azure():
    assert is_disabled("tick", {"AzureWebJobs.tick.Disabled": "true"})
    assert is_disabled("tick", {"AzureWebJobs.tick.Disabled": "1"})
    assert is_disabled("tick", {"AzureWebJobs_tick_Disabled": "True"})  # where a name may not hold dots
    assert not is_disabled("tick", {"AzureWebJobs.tick.Disabled": "false"})
    assert not is_disabled("tick", {})
