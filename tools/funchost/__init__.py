"""A local Functions host for v2-model Python apps: runs ``function_app.py`` against the local stack.

It loads the app by path, reads each function's bindings from ``app.get_functions()``
and starts one listener per trigger: HTTP routes (one server on 127.0.0.1), Service Bus
queues (peek-lock through the real SDK), storage queues (visibility timeout, poison
queue) and timers (NCRONTAB with seconds); it sends ``func.Out`` / ``$return`` values to
storage or Service Bus queues, or back as the HTTP response.
Settings come from ``local.settings.json`` and ``host.json`` as in Core Tools.

Run it with ``python -m tools.funchost [--app-dir .] [--settings local.settings.json] [--port 7071]``;
see README.md (next to this file) for what it does and does not emulate.
It imports nothing from the app it runs nor from the project around it.
"""

__all__ = ["READY_MARKER", "STOPPED_MARKER", "Host"]


def __getattr__(name: str):
    # Lazily: the worker process imports this package's ``rpc`` and ``worker`` modules only.
    if name in __all__:
        from . import host  # noqa: PLC0415

        return getattr(host, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
