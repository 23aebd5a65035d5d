"""Fixtures shared by the suite live in tests/fixtures and are loaded as plugins."""

pytest_plugins = [
    "tests.fixtures.azurite",
    "tests.fixtures.servicebus",
    "tests.fixtures.tables",
    "tests.fixtures.app",
    "tests.fixtures.report",
    "tests.fixtures.fake_remote",
    "tests.fixtures.funchost",
]
