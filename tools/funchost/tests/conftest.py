"""Fixtures for the host's own tests (they need nothing from the project around the tool).

Session-wide Azurite (npm, see ``azurite.py``) and Service Bus emulator
(``tools.servicebus_emulator``, in a background thread) on free loopback ports; each
test declares its own queues with unique names. ``funchost`` starts host processes
for the test app (``app/``) and stops them at the end of the test, attaching their
logs to a failing test's report. A missing Azurite or an emulator that cannot start
fails the run with a clear message: these tests are never skipped.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from tools import servicebus_emulator as emulator
from tools.funchost.testing import FuncHosts

from . import azurite as azurite_launcher
from .support import APP_DIR

_FIGURES: list[str] = []


@pytest.fixture(scope="session")
def azurite() -> Iterator[azurite_launcher.Azurite]:
    try:
        instance = azurite_launcher.start()
    except azurite_launcher.AzuriteError as error:
        pytest.fail(f"Azurite is required for these tests and could not start: {error}", pytrace=False)
    yield instance
    instance.stop()


@pytest.fixture(scope="session")
def storage_connection_string(azurite) -> str:
    return azurite.connection_string


@pytest.fixture(scope="session")
def servicebus_emulator() -> Iterator[emulator.ServiceBusEmulator]:
    try:
        instance = emulator.start(host="127.0.0.1", port=0)
    except Exception as error:  # noqa: BLE001 - any reason it cannot run fails the run
        pytest.fail(f"The Service Bus emulator is required for these tests and could not start: {error}", pytrace=False)
    yield instance
    instance.stop()


@pytest.fixture(scope="session")
def servicebus_connection_string(servicebus_emulator) -> str:
    return servicebus_emulator.connection_string


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """A short name unique to this test, valid for storage and Service Bus queues."""

    def make(prefix: str = "t") -> str:
        return f"{prefix}{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture
def report_figure() -> Callable[[str], None]:
    """Call with one line of text (a split, a throughput...); it is printed in the run's closing summary."""
    return _FIGURES.append


def pytest_terminal_summary(terminalreporter) -> None:
    if _FIGURES:
        terminalreporter.section("local Functions host figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture
def funchost(request, tmp_path_factory) -> Iterator[FuncHosts]:
    """Start host processes (the test app by default); all are stopped at the end, logs attached on failure."""
    hosts = FuncHosts(tmp_path_factory.mktemp("funchost-logs"), app_dir=APP_DIR)
    yield hosts
    hosts.stop_all()
    if hosts.hosts:
        request.node.add_report_section("teardown", "funchost logs", hosts.logs())
