"""Fixtures for the proxy's own tests: a session-wide Azurite (the local host's launcher,
``tools/funchost/tests/azurite.py``) and a proxy in front of it per test. A missing
Azurite fails the run with a clear message: these tests are never skipped."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

# The local host's session-wide Azurite fixture (fails the run if Azurite cannot start).
from tools.funchost.tests.conftest import azurite  # noqa: F401 - a fixture, used by name
from tools.storage_faults import RunningProxy, StorageFaults, proxied, start_in_thread, upstreams_of


@pytest.fixture
def proxy(azurite) -> Iterator[RunningProxy]:
    running = start_in_thread(upstreams_of(azurite.connection_string), StorageFaults(), seed=1)
    running.connection_string = proxied(azurite.connection_string, running.endpoints)
    yield running
    running.stop()


@pytest.fixture
def name() -> str:
    """A table and queue name unique to the test."""
    return f"t{uuid.uuid4().hex[:12]}"
