"""Bindings of the status API and the operator page: HTTP routes over api/orders.py and api/ops.py.

``GET /api/orders/{id}``, ``GET /api/orders?state=...``, ``GET /api/orders?customer=...``,
``POST /api/orders/{id}/resubmit``; ``GET /api/errors``, ``GET /api/errors/{group}``,
``POST /api/errors/{group}/resubmit`` (api/search.py); ``POST /api/orders/{id}/events/{name}`` (api/events.py);
``POST /api/orders/{id}/cancel`` (api/cancel.py);
the page ``GET /api/ops`` with its files (``/api/ops/static/{name}``), the caller's roles
(``/api/ops/me``), the counts per state over time (``/api/ops/counts``) and an order's
spans (``GET /api/orders/{id}/trace``); the archive (``GET /api/archive/{day}``,
``GET /api/archive/{day}/orders/{id}``, api/archive.py).

Functions auth level ANONYMOUS: in Azure, App Service Authentication checks the caller's
token before the request reaches the app (infra/app/api-auth.bicep), and the functions
check the caller's app role (core/access.py, app setting API_AUTH). Each route takes any
method and answers 405 for one it does not serve (the Functions host itself would answer
404). Sync functions: each reads or writes a few table rows.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import azure.functions as func

from adapters import traces
from adapters.settings import get_settings
from adapters.wiring import services
from api import archive, cancel, events, ops, orders, search
from core import access
from core.models import utcnow

bp = func.Blueprint()


def _respond(reply: orders.Reply) -> func.HttpResponse:
    body = json.dumps(reply.body) if reply.mimetype == "application/json" else reply.body
    return func.HttpResponse(body, status_code=reply.status, headers=reply.headers, mimetype=reply.mimetype)


def _read(req: func.HttpRequest, action) -> func.HttpResponse:
    """A GET for the reader role (an operator may read too)."""
    return _respond(
        orders.serve(req.method, req.headers, methods=("GET",), roles=access.READ_ROLES,
                     mode=get_settings().api_auth, action=action)
    )


def _operate(req: func.HttpRequest, action) -> func.HttpResponse:
    """A POST for the operator role."""
    return _respond(
        orders.serve(req.method, req.headers, methods=("POST",), roles=access.OPERATE_ROLES,
                     mode=get_settings().api_auth, action=action)
    )


@bp.function_name("get_order")
@bp.route(route="orders/{id}", auth_level=func.AuthLevel.ANONYMOUS)
def get_order(req: func.HttpRequest) -> func.HttpResponse:
    return _read(req, lambda: orders.get_order(req.route_params.get("id"), store=services().store))


@bp.function_name("list_orders")
@bp.route(route="orders", auth_level=func.AuthLevel.ANONYMOUS)
def list_orders(req: func.HttpRequest) -> func.HttpResponse:
    listing = search.list_by_customer if "customer" in req.params else orders.list_orders
    return _read(req, lambda: listing(req.params, store=services().store))


@bp.function_name("resubmit_order")
@bp.route(route="orders/{id}/resubmit", auth_level=func.AuthLevel.ANONYMOUS)
def resubmit_order(req: func.HttpRequest) -> func.HttpResponse:
    def action() -> orders.Reply:
        s = services()
        return orders.resubmit_order(
            req.route_params.get("id"), store=s.store, nudger=s.nudger, now=utcnow(),
            pending_timeout=s.settings.pending_timeout,
        )

    return _operate(req, action)


# --- Error orders by cause (api/search.py) ------------------------------------------------


@bp.function_name("list_errors")
@bp.route(route="errors", auth_level=func.AuthLevel.ANONYMOUS)
def list_errors(req: func.HttpRequest) -> func.HttpResponse:
    return _read(req, lambda: search.list_errors(req.params, store=services().store))


@bp.function_name("get_error_group")
@bp.route(route="errors/{group}", auth_level=func.AuthLevel.ANONYMOUS)
def get_error_group(req: func.HttpRequest) -> func.HttpResponse:
    return _read(req, lambda: search.get_group(req.route_params.get("group"), req.params, store=services().store))


@bp.function_name("resubmit_error_group")
@bp.route(route="errors/{group}/resubmit", auth_level=func.AuthLevel.ANONYMOUS)
def resubmit_error_group(req: func.HttpRequest) -> func.HttpResponse:
    def action() -> orders.Reply:
        s = services()
        return search.resubmit_errors(
            req.route_params.get("group"), req.params, store=s.store, nudger=s.nudger, now=utcnow,
            pending_timeout=s.settings.pending_timeout, per_second=s.settings.bulk_resubmit_per_second,
            batch=s.settings.bulk_resubmit_batch,
        )

    return _operate(req, action)


@bp.function_name("post_order_event")
@bp.route(route="orders/{id}/events/{name}", auth_level=func.AuthLevel.ANONYMOUS)
def post_order_event(req: func.HttpRequest) -> func.HttpResponse:
    def action() -> orders.Reply:
        from scheduler.blueprint import scheduler

        s = services()
        return events.post_event(
            req.route_params.get("id"), req.route_params.get("name"), req.get_body(),
            scheduler=scheduler(s), now=utcnow(), signed_in=access.signed_in(s.settings.api_auth, req.headers),
        )

    return _operate(req, action)


@bp.function_name("cancel_order_api")
@bp.route(route="orders/{id}/cancel", auth_level=func.AuthLevel.ANONYMOUS)
def cancel_order_api(req: func.HttpRequest) -> func.HttpResponse:
    def action() -> orders.Reply:
        s = services()
        return cancel.cancel_order(
            req.route_params.get("id"), req.get_body(), by=cancel.caller(s.settings.api_auth, req.headers),
            store=s.store, publisher=s.publisher, nudger=s.nudger, now=utcnow(),
        )

    return _operate(req, action)


# --- the operator page (api/ops.py) ------------------------------------------------------


@bp.function_name("ops_page")
@bp.route(route="ops", auth_level=func.AuthLevel.ANONYMOUS)
def ops_page(req: func.HttpRequest) -> func.HttpResponse:
    return _read(req, lambda: ops.page(ops.base_of(urlsplit(req.url).path)))


@bp.function_name("ops_asset")
@bp.route(route="ops/static/{name}", auth_level=func.AuthLevel.ANONYMOUS)
def ops_asset(req: func.HttpRequest) -> func.HttpResponse:
    return _read(req, lambda: ops.asset(req.route_params.get("name")))


@bp.function_name("ops_me")
@bp.route(route="ops/me", auth_level=func.AuthLevel.ANONYMOUS)
def ops_me(req: func.HttpRequest) -> func.HttpResponse:
    return _read(req, lambda: ops.me(get_settings().api_auth, req.headers))


@bp.function_name("ops_counts")
@bp.route(route="ops/counts", auth_level=func.AuthLevel.ANONYMOUS)
def ops_counts(req: func.HttpRequest) -> func.HttpResponse:
    return _read(req, lambda: ops.counts(req.params, store=services().store, now=utcnow()))


@bp.function_name("get_order_trace")
@bp.route(route="orders/{id}/trace", auth_level=func.AuthLevel.ANONYMOUS)
def get_order_trace(req: func.HttpRequest) -> func.HttpResponse:
    return _read(
        req,
        lambda: ops.trace(req.route_params.get("id"), store=services().store,
                          spans=traces.source(get_settings())),
    )


# --- the archive (api/archive.py): finished orders retention moved to blob storage ------------


@bp.function_name("list_archived")
@bp.route(route="archive/{day}", auth_level=func.AuthLevel.ANONYMOUS)
def list_archived(req: func.HttpRequest) -> func.HttpResponse:
    return _read(req, lambda: archive.list_day(req.route_params.get("day"), req.params, archive=services().archive()))


@bp.function_name("get_archived_order")
@bp.route(route="archive/{day}/orders/{id}", auth_level=func.AuthLevel.ANONYMOUS)
def get_archived_order(req: func.HttpRequest) -> func.HttpResponse:
    return _read(
        req,
        lambda: archive.get_archived(
            req.route_params.get("day"), req.route_params.get("id"), archive=services().archive()
        ),
    )
