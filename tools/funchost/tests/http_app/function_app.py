"""A small app of HTTP functions for the local host's HTTP trigger tests.

``get_item`` and the others without ``async`` are plain (sync) functions: the worker
runs them on its shared thread pool; ``echo`` is ``async def``: its event loop. Each
answers with what it received, so a test sees the request as the function saw it.
"""

import json
import logging
import os
import threading
import time

import azure.functions as func

app = func.FunctionApp(http_auth_level=func.AuthLevel.ANONYMOUS)
log = logging.getLogger("funchost.tests.http_app")


def seen(req: func.HttpRequest) -> dict:
    return {
        "type": f"{type(req).__module__}.{type(req).__name__}",
        "method": req.method,
        "url": req.url,
        "headers": dict(req.headers),
        "params": dict(req.params),
        "route_params": dict(req.route_params),
        "body": req.get_body().decode("utf-8", "replace"),
        "thread": threading.current_thread().name,
    }


@app.route(route="items/{id}", methods=["GET"])
def get_item(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(json.dumps(seen(req)), mimetype="application/json")


@app.route(route="echo/{name:alpha}/{*rest}", methods=["POST", "PUT"], auth_level=func.AuthLevel.FUNCTION)
async def echo(req: func.HttpRequest) -> func.HttpResponse:
    body = {**seen(req), "json": req.get_json()}
    return func.HttpResponse(
        json.dumps(body), status_code=201, headers={"X-Echo": req.route_params["name"]}, mimetype="application/json"
    )


@app.route(route="numbers/{n:int:min(1)}/{unit?}", methods=["GET"])
def numbers(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(json.dumps(dict(req.route_params)), mimetype="application/json")


@app.route(route="anything")
def anything(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(req.method, headers={"X-Method": req.method})


@app.route(route="boom", methods=["GET"])
def boom(req: func.HttpRequest) -> func.HttpResponse:
    raise ValueError("secret detail of a failure")


@app.route(route="wrong-type", methods=["GET"])
def wrong_type(req: func.HttpRequest) -> func.HttpResponse:
    return 42  # the worker's converter refuses it: the invocation fails


@app.route(route="text", methods=["GET"])
def text(req: func.HttpRequest) -> str:
    return "plain text é"


@app.route(route="nothing", methods=["GET"])
def nothing(req: func.HttpRequest):  # annotated "-> None", Microsoft's runtime refuses the whole app
    return None


@app.route(route="html", methods=["GET"])
def html(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(
        "<p>hé</p>", mimetype="text/html", charset="latin-1", headers={"Set-Cookie": "a=1; Path=/"}
    )


# Two routes that both match /api/things/special: the host tries them in the
# alphabetical order of the function names, so a_thing answers.
@app.function_name("a_thing")
@app.route(route="things/{name}", methods=["GET"])
def thing(req: func.HttpRequest) -> str:
    return f"a_thing {req.route_params['name']}"


@app.function_name("b_special")
@app.route(route="things/special", methods=["GET"])
def special(req: func.HttpRequest) -> str:
    return "b_special"


@app.route(route="slow", methods=["GET"])
def slow(req: func.HttpRequest) -> str:
    """Waits until the file named in the query exists (the test releases it), at most 30 s."""
    release = req.params["release"]
    log.info("slow: waiting for %s", os.path.basename(release))
    deadline = time.monotonic() + 30
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)
    return "released" if os.path.exists(release) else "not released"


@app.route(route="enqueue", methods=["POST"])
@app.queue_output(arg_name="out", queue_name="%FH_HTTP_OUT_QUEUE%", connection="AzureWebJobsStorage")
def enqueue(req: func.HttpRequest, out: func.Out[str]) -> func.HttpResponse:
    out.set(req.get_body().decode("utf-8"))
    return func.HttpResponse(status_code=202)
