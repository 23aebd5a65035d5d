"""The app with sync agents, as they were before they became ``async``: the comparator
for the worker-concurrency figure (``make bench``) and the pool-limit test
(tests/e2e/test_worker_concurrency.py). Never deployed.

A sync agent holds a thread of the worker's one shared pool (``min(32, cores + 4)``
threads by default) for the whole call: the HTTP round trip and every backoff sleep.
Here each agent runs the app's own agent code to its end on an event loop of the
worker thread it was given, which holds that thread exactly as blocking I/O would.
The scheduler and the supervisor are the app's own.

:func:`write_app` writes a script root (``function_app.py`` and the app's ``host.json``)
for the local host to run.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import azure.functions as func

from agents.blueprint import bind, handle
from core.workflow import remotes
from devtools.paths import ROOT

bp = func.Blueprint()
_thread = threading.local()


def _on_this_thread(coroutine) -> None:
    """Run to the end on this worker thread's own loop, holding the thread meanwhile."""
    loop = getattr(_thread, "loop", None)
    if loop is None:
        loop = _thread.loop = asyncio.new_event_loop()
    loop.run_until_complete(coroutine)


def _register(remote: str) -> None:
    def run_agent(msg: func.ServiceBusMessage) -> None:
        _on_this_thread(handle(msg, remote))

    bind(bp, remote, run_agent)


for _remote in remotes():
    _register(_remote)

_FUNCTION_APP = f'''"""The app with sync agents (written by {__name__}; not the app)."""

import sys

sys.path.insert(0, {{root!r}})

import azure.functions as func  # noqa: E402

from {__name__} import bp as agents  # noqa: E402
from scheduler.blueprint import bp as scheduler  # noqa: E402
from supervisor.blueprint import bp as supervisor  # noqa: E402

app = func.FunctionApp()
app.register_functions(scheduler)
app.register_functions(agents)
app.register_functions(supervisor)
'''


def write_app(directory: Path) -> Path:
    """A script root running the app with sync agents: ``function_app.py`` and the app's ``host.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "function_app.py").write_text(_FUNCTION_APP.format(root=str(ROOT)))
    shutil.copyfile(ROOT / "host.json", directory / "host.json")
    return directory
