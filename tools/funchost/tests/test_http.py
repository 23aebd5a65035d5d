"""HTTP triggers through a real host process (the small app in ``http_app/``), and the
route templates on their own.

What is checked against the Functions host's behaviour: the ``api`` route prefix (and
host.json's ``extensions.http.routePrefix``), route parameters and constraints, the
request as the worker hands it (``azure.functions.HttpRequest``: method, URL, lower-cased
headers, query, route parameters, body), the response as the worker's converter encodes
it, 404 for an unknown path and for a known path with a method the route does not take
(Azure answers 404 there, not 405), 500 with an empty body when the function raises,
routes tried in the alphabetical order of the function names, sync functions on the
worker's thread pool and async ones on its event loop, loopback only, the port from
``--port`` or local.settings.json, a draining stop.
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import threading
from pathlib import Path

import pytest
import requests

from tools.funchost.http_trigger import HttpServer, RouteError, RouteTemplate, path_segments

from .support import eventually

HTTP_APP_DIR = Path(__file__).resolve().parent / "http_app"
#: The app's one function with a storage output, off unless a test needs it (it needs Azurite).
WITHOUT_STORAGE = {"AzureWebJobs.enqueue.Disabled": "true"}


@pytest.fixture
def host(funchost):
    (started,) = funchost.start(HTTP_APP_DIR, env=WITHOUT_STORAGE)
    return started


def test_the_readiness_line_and_the_log_give_the_url_on_loopback(host):
    assert host.http_url.startswith("http://127.0.0.1:")
    port = int(host.http_url.rsplit(":", 1)[1])
    assert port > 0
    log = host.log_text()
    assert f"funchost http: listening on {host.http_url} (route prefix 'api')" in log
    assert f"Function get_item: httpTrigger [GET] {host.http_url}/api/items/{{id}}" in log
    assert f"Function anything: httpTrigger [all methods] {host.http_url}/api/anything" in log


def test_get_with_route_parameters_query_and_headers(host):
    response = requests.get(
        f"{host.http_url}/api/items/a%20b?x=1&x=2&empty=&y=3", headers={"X-Custom": "v", "Accept": "text/plain"},
        timeout=10,
    )
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    seen = response.json()
    assert seen["type"] == "azure.functions.http.HttpRequest"
    assert seen["method"] == "GET"
    assert seen["url"] == f"{host.http_url}/api/items/a%20b?x=1&x=2&empty=&y=3"
    assert seen["route_params"] == {"id": "a b"}  # percent-decoded
    assert seen["params"] == {"x": "1,2", "y": "3"}  # repeated joined, empty left out, as the host does
    assert seen["headers"]["x-custom"] == "v" and seen["headers"]["accept"] == "text/plain"
    assert all(name == name.lower() for name in seen["headers"])
    assert seen["body"] == ""
    assert seen["thread"].startswith("ThreadPoolExecutor-")  # a sync function: the runtime's shared pool
    (invocation,) = host.invocations("get_item")
    assert invocation.succeeded and "trigger=httpTrigger method=GET path=/api/items/a%20b" in invocation.details


def test_post_with_a_body_to_an_async_function(host):
    body = {"order": "o-1", "lines": [1, 2]}
    response = requests.post(f"{host.http_url}/api/echo/abc/d/e/f", json=body, timeout=10)
    assert response.status_code == 201
    assert response.headers["X-Echo"] == "abc"
    assert response.headers["Content-Type"] == "application/json"
    seen = response.json()
    assert seen["method"] == "POST"
    assert seen["json"] == body and json.loads(seen["body"]) == body
    assert seen["route_params"] == {"name": "abc", "rest": "d/e/f"}  # a catch-all keeps its slashes
    assert seen["headers"]["content-type"] == "application/json"
    assert seen["thread"] == "MainThread"  # async: the worker's event loop, in its main thread
    # The function's auth level (FUNCTION) is not enforced locally, as under Core Tools.
    chunked = requests.put(f"{host.http_url}/api/echo/abc", data=iter([b'{"a":', b"1}"]), timeout=10)
    assert chunked.status_code == 201 and chunked.json()["json"] == {"a": 1}
    assert chunked.json()["route_params"] == {"name": "abc"}


def test_unknown_paths_and_wrong_methods_get_an_empty_404(host):
    for method, path in [
        ("GET", "/api/nowhere"),
        ("GET", "/items/1"),  # the route prefix is part of every route
        ("GET", "/api/items"),
        ("GET", "/api/items/1/more"),
        ("GET", "/api/echo/ab1/x"),  # {name:alpha}
        ("GET", "/api/numbers/0"),  # {n:int:min(1)}
        ("GET", "/api/numbers/x"),
        # A route that exists, with a method it does not take: Azure answers 404, not 405
        # (Azure/azure-functions-host#10098), so does this host.
        ("POST", "/api/items/1"),
        ("DELETE", "/api/items/1"),
        ("GET", "/api/echo/abc/x"),
    ]:
        response = requests.request(method, host.http_url + path, timeout=10)
        assert (response.status_code, response.content) == (404, b""), (method, path)
    assert host.invocations("get_item") == [] and host.invocations("echo") == []


def test_route_constraints_optional_parameters_and_a_trailing_slash(host):
    assert requests.get(f"{host.http_url}/api/numbers/5/kg", timeout=10).json() == {"n": "5", "unit": "kg"}
    assert requests.get(f"{host.http_url}/api/numbers/5", timeout=10).json() == {"n": "5"}
    assert requests.get(f"{host.http_url}/api/numbers/5/", timeout=10).json() == {"n": "5"}
    assert requests.get(f"{host.http_url}/API/Items/1", timeout=10).status_code == 200  # literals: any case


def test_a_function_that_raises_gets_a_500_without_its_details(host):
    response = requests.get(f"{host.http_url}/api/boom", timeout=10)
    assert (response.status_code, response.content) == (500, b"")
    assert "secret" not in str(response.headers)
    (invocation,) = host.invocations("boom")
    assert not invocation.succeeded
    log = host.log_text()
    assert "ValueError: secret detail of a failure" in log  # the traceback is in the log only
    # A return value the worker's converter refuses fails the invocation too.
    assert requests.get(f"{host.http_url}/api/wrong-type", timeout=10).status_code == 500
    assert 'unsupported type' in host.wait_for_log(r"Functions\.wrong_type' \(Failed.*").group(0)


def test_responses_as_the_worker_encodes_them(host):
    text = requests.get(f"{host.http_url}/api/text", timeout=10)
    assert (text.status_code, text.headers["Content-Type"]) == (200, "text/plain; charset=utf-8")
    assert text.text == "plain text é"
    # Microsoft's runtime cannot encode None for an http output: the invocation fails, the caller gets a 500.
    nothing = requests.get(f"{host.http_url}/api/nothing", timeout=10)
    assert (nothing.status_code, nothing.content) == (500, b"")
    assert 'unsupported type "http" for Python type "NoneType"' in host.log_text()
    html = requests.get(f"{host.http_url}/api/html", timeout=10)
    assert html.headers["Content-Type"] == "text/html; charset=latin-1"
    assert html.content == "<p>hé</p>".encode("latin-1")
    # As the host appends the worker's RpcHttpCookie (ASP.NET Core's lower-case attributes; the runtime sends
    # the morsel's empty domain as a NullableString, and the host writes what it is given).
    assert html.headers["Set-Cookie"] == "a=1; domain=; path=/"
    head = requests.head(f"{host.http_url}/api/anything", timeout=10)
    assert (head.status_code, head.headers["X-Method"], head.content) == (200, "HEAD", b"")
    assert requests.patch(f"{host.http_url}/api/anything", timeout=10).text == "PATCH"  # no methods: all


def test_overlapping_routes_are_tried_in_the_alphabetical_order_of_the_function_names(host):
    # a_thing (things/{name}) comes before b_special (things/special), as in Azure
    # (Azure/azure-functions-host#9876): b_special is never reached.
    assert requests.get(f"{host.http_url}/api/things/special", timeout=10).text == "a_thing special"
    assert requests.get(f"{host.http_url}/api/things/other", timeout=10).text == "a_thing other"
    assert host.invocations("b_special") == []


def test_the_route_prefix_comes_from_host_json(funchost):
    (host,) = funchost.start(
        HTTP_APP_DIR, env={**WITHOUT_STORAGE, "AzureFunctionsJobHost__extensions__http__routePrefix": ""}
    )
    assert requests.get(f"{host.http_url}/items/7", timeout=10).json()["route_params"] == {"id": "7"}
    assert requests.get(f"{host.http_url}/api/items/7", timeout=10).status_code == 404
    assert "(route prefix '')" in host.log_text()


def test_an_http_function_sends_its_other_outputs(funchost, storage_connection_string, unique_name):
    from azure.storage.queue import QueueClient

    queue = unique_name("httpout")
    (host,) = funchost.start(
        HTTP_APP_DIR, env={"AzureWebJobsStorage": storage_connection_string, "FH_HTTP_OUT_QUEUE": queue}
    )
    response = requests.post(f"{host.http_url}/api/enqueue", data="hello queue", timeout=10)
    assert (response.status_code, response.content) == (202, b"")
    client = QueueClient.from_connection_string(storage_connection_string, queue)
    (message,) = client.receive_messages()
    assert base64.b64decode(message.content) == b"hello queue"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_port_comes_from_the_command_line_or_local_settings(funchost, tmp_path):
    port = _free_port()
    settings = tmp_path / "local.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": {}, "Host": {"LocalHttpPort": port}}))
    (host,) = funchost.start(HTTP_APP_DIR, env=WITHOUT_STORAGE, settings=settings, http_port=None)
    assert host.http_url == f"http://127.0.0.1:{port}"
    assert requests.get(f"{host.http_url}/api/text", timeout=10).status_code == 200

    # The port is taken now: a second host cannot listen, says why, and exits 1.
    (second,) = funchost.start(HTTP_APP_DIR, env=WITHOUT_STORAGE, http_port=port, wait=False)
    assert second.process.wait(60) == 1
    assert f"cannot listen on {port} for the HTTP functions" in second.log_text()


def test_a_stop_lets_requests_in_flight_finish_and_takes_no_new_ones(host, tmp_path):
    release = tmp_path / "release"
    result: dict = {}

    def call() -> None:
        result["response"] = requests.get(f"{host.http_url}/api/slow", params={"release": str(release)}, timeout=60)

    caller = threading.Thread(target=call)
    caller.start()
    host.wait_for_log(r"slow: waiting for release")
    host.send_signal(signal.SIGTERM)
    host.wait_for_log(r"SIGTERM received")
    port = int(host.http_url.rsplit(":", 1)[1])

    def refused() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return False
        except OSError:
            return True

    eventually(refused, timeout=10, what="the server to stop taking connections")
    release.write_text("go")
    caller.join(60)
    assert result["response"].status_code == 200 and result["response"].text == "released"
    assert host.process.wait(60) == 0 and host.stopped_cleanly


# --- in process: the server's address and the route templates ---------------------------


def test_the_server_listens_on_loopback_only():
    server = HttpServer(0)
    try:
        assert server._server.server_address[0] == "127.0.0.1"
        assert server.url == f"http://127.0.0.1:{server.port}"
    finally:
        server.stop_accepting()


@pytest.mark.parametrize(
    ("template", "path", "expected"),
    [
        ("orders/{id}", "/api/orders/o-1", {"id": "o-1"}),
        ("orders/{id}", "/api/orders/o-1/", {"id": "o-1"}),
        ("orders/{id}", "/api/Orders/o-1", {"id": "o-1"}),
        ("orders/{id}", "/api/orders", None),
        ("orders/{id}", "/api/orders/a/b", None),
        ("orders/{id}", "/orders/o-1", None),
        ("orders/{id}/resubmit", "/api/orders/o%2F1/resubmit", {"id": "o/1"}),
        ("orders/{id?}", "/api/orders", {}),
        ("orders/{id=all}", "/api/orders", {"id": "all"}),
        ("files/{*path}", "/api/files/a/b%20c/d", {"path": "a/b c/d"}),
        ("files/{*path}", "/api/files", {}),
        ("n/{n:int}", "/api/n/-12", {"n": "-12"}),
        ("n/{n:int}", "/api/n/99999999999", None),
        ("n/{n:long:range(1,5)}", "/api/n/5", {"n": "5"}),
        ("n/{n:long:range(1,5)}", "/api/n/6", None),
        ("b/{b:bool}", "/api/b/TRUE", {"b": "TRUE"}),
        ("g/{g:guid}", "/api/g/0f8fad5b-d9cb-469f-a165-70867728950e", {"g": "0f8fad5b-d9cb-469f-a165-70867728950e"}),
        ("g/{g:guid}", "/api/g/nope", None),
        ("s/{s:minlength(2):maxlength(3)}", "/api/s/abcd", None),
        ("s/{s:length(2,3)}", "/api/s/abc", {"s": "abc"}),
        ("r/{r:regex(^o-\\d+$)}", "/api/r/O-12", {"r": "O-12"}),
        ("r/{r:regex(^o-\\d+$)}", "/api/r/x-12", None),
    ],
)
def test_route_templates_match_as_in_aspnet_core(template, path, expected):
    assert RouteTemplate.parse(template).match(path_segments(path)) == expected


@pytest.mark.parametrize(
    "template",
    ["a//b", "a/{x}{y}", "a/x{y}", "{*rest}/a", "{a}/{a}", "{x?}/b", "a/{x:nosuch}", "a/{1x}", "a/{x?=1}"],
)
def test_bad_route_templates_are_refused(template):
    with pytest.raises(RouteError):
        RouteTemplate.parse(template)


def test_a_function_with_a_bad_route_is_in_error_and_the_others_run(funchost, tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    (app / "function_app.py").write_text(
        "import azure.functions as func\n"
        "app = func.FunctionApp(http_auth_level=func.AuthLevel.ANONYMOUS)\n"
        "@app.route(route='bad/{x}{y}')\n"
        "def bad(req: func.HttpRequest) -> str:\n    return 'bad'\n"
        "@app.route(route='good')\n"
        "def good(req: func.HttpRequest) -> str:\n    return 'good'\n"
    )
    (host,) = funchost.start(app, allow_errors=True)
    assert (host.functions, host.errors) == (1, 1)
    assert "Function bad is in error" in host.log_text()
    assert requests.get(f"{host.http_url}/api/good", timeout=10).text == "good"
