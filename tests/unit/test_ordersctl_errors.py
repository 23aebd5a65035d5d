"""ordersctl keeps the contract of docs/operate.md ("ordersctl") on bad input and refusals: exit 0 ok, 1 a
clear failure (one ``error: ...`` line on stderr, no traceback), 2 a usage error; and input
it can check is checked before any connection is opened.

Also the fake remote's own command line (devtools/fake_remote): a port out of range is a
usage error, not a traceback."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import ordersctl.cli as cli
from adapters.accounts import AccountLayoutChanged
from adapters.clients import DEV_ACCOUNT, DEV_KEY  # Azurite's well-known account: no secret
from core import names

ROOT = Path(__file__).resolve().parents[2]
CONNECTION_PREFIXES = (names.STORAGE_CONNECTION, names.STATE_STORAGE_CONNECTION, names.SERVICEBUS_CONNECTION,
                       names.ARCHIVE_STORAGE_CONNECTION, names.STATE_STORAGE_ACCOUNTS_SETTING)


def flat(text: str) -> str:
    """Output as one line of words: typer's usage-error box wraps and frames its text."""
    return " ".join(text.translate(str.maketrans("│╭╮╰╯─", "      ")).split())


def clean_env(**values: str) -> dict:
    """This process's environment without any connection of the app's, plus ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CONNECTION_PREFIXES)}
    env.pop("FORCE_COLOR", None)
    env.update(PYTHONPATH=str(ROOT), COLUMNS="80", **values)
    return env


@pytest.fixture
def no_connection(monkeypatch, tmp_path):
    """No settings file, no connection in the environment, and any attempt to build the
    commands' clients recorded and refused: the test's input must be refused before."""
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith(CONNECTION_PREFIXES):
            monkeypatch.delenv(key)
    # Settings that would reach somewhere, were anything opened.
    monkeypatch.setenv(names.STORAGE_CONNECTION, "UseDevelopmentStorage=true")
    monkeypatch.setenv(names.SERVICEBUS_CONNECTION, "Endpoint=sb://127.0.0.1/;SharedAccessKeyName=k;SharedAccessKey=v")
    opened: list[str] = []

    def connect(what):
        def opening(self):
            opened.append(what)
            raise AssertionError(f"{what} was opened")
        return opening

    # The commands reach storage and Service Bus through these two only.
    monkeypatch.setattr(cli.Context, "services", property(connect("storage")))
    monkeypatch.setattr(cli.Context, "servicebus", connect("Service Bus"))
    return opened


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


# --- 1. Storage answering an HTTP error -------------------------------------------------


class AzureErrors(http.server.BaseHTTPRequestHandler):
    """Answers every request as the Table service answers a refusal: ``status`` with an
    OData error body and ``x-ms-error-code``."""

    status = 403
    code = "AuthorizationPermissionMismatch"
    text = "This request is not authorized to perform this operation using this permission."

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps({"odata.error": {"code": self.code, "message": {
            "lang": "en-US", "value": f"{self.text}\nRequestId:0f0e0d0c-0000-0000-0000-000000000000\n"
                                      "Time:2026-11-25T10:00:00.0000000Z"}}}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json;odata=minimalmetadata;streaming=true;charset=utf-8")
        self.send_header("x-ms-error-code", self.code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def refusing_storage(request):
    status, code, text = request.param
    handler = type("Handler", (AzureErrors,), {"status": status, "code": code, "text": text})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], status, code
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("refusing_storage", [
    (403, "AuthorizationPermissionMismatch",
     "This request is not authorized to perform this operation using this permission."),
    (404, "TableNotFound", "The table specified does not exist."),
], indirect=True, ids=["403", "404"])
def test_a_storage_refusal_is_one_error_line_not_a_traceback(refusing_storage, tmp_path):
    port, status, code = refusing_storage
    storage = (f"DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};"
               f"TableEndpoint=http://127.0.0.1:{port}/{DEV_ACCOUNT};"
               f"QueueEndpoint=http://127.0.0.1:{port}/{DEV_ACCOUNT}")
    env = clean_env(**{names.STORAGE_CONNECTION: storage,
                       names.SERVICEBUS_CONNECTION: "Endpoint=sb://127.0.0.1/;SharedAccessKeyName=k;SharedAccessKey=v"})
    done = subprocess.run([sys.executable, "-m", "ordersctl", "status", "o-1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: storage answered HTTP "), done.stderr
    assert f"HTTP {status}" in lines[0] and code in lines[0], lines[0]
    if status == 403:
        assert "Storage Table data role" in lines[0] and "docs/deploy.md" in lines[0], lines[0]
    else:
        assert "The table specified does not exist" in lines[0] and "role" not in lines[0], lines[0]


# --- 2. --settings: a file that is missing, or not a settings file -------------------------


@pytest.mark.parametrize(("content", "says"), [
    (None, "No such file"),
    ("{ not json", "is not JSON"),
    ('["Values"]', "expected {\"Values\""),
    ('{"Values": null}', "expected {\"Values\""),
])
def test_a_bad_settings_file_is_a_usage_error_naming_it(content, says, no_connection):
    if content is not None:
        Path("given.settings.json").write_text(content, encoding="utf-8")
    result = CliRunner().invoke(cli.app, ["breakers", "--settings", "given.settings.json"])
    assert result.exit_code == 2, result.output
    shown = flat(result.output)
    assert "Invalid value for '--settings'" in shown and "'given.settings.json'" in shown and says in shown, shown
    assert "Traceback" not in result.output


def test_a_broken_local_settings_json_read_by_default_is_a_clear_failure(no_connection, monkeypatch):
    for key in (names.STORAGE_CONNECTION, names.SERVICEBUS_CONNECTION):
        monkeypatch.delenv(key)  # no connection in the environment: local.settings.json is read
    Path("local.settings.json").write_text("{ not json", encoding="utf-8")
    result = CliRunner().invoke(cli.app, ["breakers"])
    assert result.exit_code == 1, result.output
    assert error_lines(result.output) == [result.output.strip()], result.output
    assert "'local.settings.json' is not JSON" in result.output


# --- 3. send-order: a file that is missing, an item whose price is not money -------------


def test_send_order_from_a_missing_file_is_a_usage_error_before_any_connection(no_connection):
    result = CliRunner().invoke(cli.app, ["send-order", "--file", "missing-order.json"])
    assert result.exit_code == 2, result.output
    shown = flat(result.output)
    assert "Invalid value for '--file'" in shown and "'missing-order.json'" in shown and "No such file" in shown
    assert no_connection == []


@pytest.mark.parametrize("item", ["sku-1:2:abc", "sku-1:2:", "sku-1:2:1e9", "sku-1:2:-1", "sku-1:2:NaN",
                                  "sku-1:2:1.234", "sku-1:x:1.00", "sku-1:2"])
def test_an_item_that_is_not_sku_quantity_price_is_a_usage_error_before_any_connection(item, no_connection):
    result = CliRunner().invoke(cli.app, ["send-order", "--order-id", "o-1", "--customer", "c-1", "--item", item])
    assert result.exit_code == 2, result.output
    shown = flat(result.output)
    assert f"Invalid value for '--item': {item!r}" in shown and "SKU:QUANTITY:UNIT_PRICE" in shown, shown
    assert no_connection == []


# --- 4. rejections --day, and archive show's day, checked before connecting ----------------


@pytest.mark.parametrize("day", ["notaday", "2026-13-45", "2026-1-5", "[/]"])
@pytest.mark.parametrize("command", [["rejections", "--day"], ["archive", "show"]])
def test_a_day_that_is_not_a_day_is_refused_before_any_connection(command, day, no_connection):
    result = CliRunner().invoke(cli.app, [*command, day])
    assert result.exit_code == 1, result.output
    assert error_lines(result.output) == [result.output.strip()], result.output
    assert f"{day!r} is not a" in result.output
    assert no_connection == []


def test_a_real_day_goes_on_to_the_store(no_connection):
    result = CliRunner().invoke(cli.app, ["rejections", "--day", "2026-11-25"])
    assert isinstance(result.exception, AssertionError) and len(no_connection) == 1


# --- 5. watch-status and a foreign message; a changed account layout ------------------------


class Message:
    def __init__(self, body: str, message_id: str) -> None:
        self.body, self.message_id = body, message_id

    def __str__(self) -> str:
        return self.body


class Receiver:
    def __init__(self, messages) -> None:
        self.messages, self.completed, self.dead_lettered = messages, [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __iter__(self):
        return iter(self.messages)

    def complete_message(self, message) -> None:
        self.completed.append(message.message_id)

    def dead_letter_message(self, message, reason=None, error_description=None) -> None:
        self.dead_lettered.append((message.message_id, reason))


class ServiceBus:
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def get_queue_receiver(self, queue, **kwargs) -> Receiver:
        return self.receiver


def test_watch_status_moves_a_message_that_is_not_a_status_event_aside_and_goes_on(monkeypatch):
    event = {"order_id": "o-1", "status": "processed", "time": "2026-11-25T10:00:00+00:00", "detail": "done [/]"}
    receiver = Receiver([Message("not json {", "m-1"), Message("[1, 2]", "m-2"), Message('{"order_id": "o-1"}', "m-3"),
                         Message(json.dumps(event), "m-4")])
    context = type("Context", (), {"servicebus": lambda self: ServiceBus(receiver)})
    monkeypatch.setattr(cli, "_context", lambda settings: context())
    result = CliRunner().invoke(cli.app, ["watch-status", "replies", "--timeout", "1"])
    assert result.exit_code == 0, result.output
    assert receiver.completed == ["m-4"]
    assert [m for m, _ in receiver.dead_lettered] == ["m-1", "m-2", "m-3"]
    assert "o-1  processed  done [/]" in result.output
    for message_id in ("m-1", "m-2", "m-3"):
        assert f"skipped message {message_id}: not a status event" in result.output
    assert "Traceback" not in result.output


def test_a_changed_account_layout_is_a_clear_failure(monkeypatch, tmp_path):
    from adapters import wiring

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(names.STORAGE_CONNECTION, "UseDevelopmentStorage=true")
    monkeypatch.setenv(names.SERVICEBUS_CONNECTION, "Endpoint=sb://127.0.0.1/;SharedAccessKeyName=k;SharedAccessKey=v")
    said = (f"{names.STATE_STORAGE_ACCOUNTS_SETTING}: the account at place 0 of 2 (sta) was written as place 1 "
            "of 2. The accounts of the order state are fixed for the deployment's life")

    def changed(settings):
        raise AccountLayoutChanged(said)

    monkeypatch.setattr(wiring.Services, "from_settings", staticmethod(changed))
    result = CliRunner().invoke(cli.app, ["status", "o-1"])
    assert result.exit_code == 1, result.output
    assert error_lines(result.output) == [f"error: {said}"], result.output


# --- 6. The top-level help ------------------------------------------------------------------


def test_the_help_summary_is_complete_and_lists_every_command():
    result = CliRunner().invoke(cli.app, ["--help"])
    assert result.exit_code == 0, result.output
    summary = cli.app.info.help
    assert summary.endswith(".") and not summary.rstrip(".").endswith(",")
    shown = flat(result.output)
    assert summary in shown
    commands = list(typer.main.get_command(cli.app).commands)
    assert len(commands) > 10 and "archive" in commands
    for name in commands:
        assert f" {name} " in shown, name


# --- 7. The fake remote's port --------------------------------------------------------------


@pytest.mark.parametrize("port", ["-5", "65536", "http"])
def test_the_fake_remote_refuses_a_port_out_of_range_as_a_usage_error(port, tmp_path):
    done = subprocess.run([sys.executable, "-m", "devtools.fake_remote", "--port", port], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"argument --port: {port if port != 'http' else repr(port)} is not a port" in done.stderr
    assert "0..65535" in done.stderr


def test_the_fake_remote_takes_ports_0_to_65535():
    from devtools.fake_remote.__main__ import parse_args

    assert [parse_args(["--port", p]).port for p in ("0", "7081", "65535")] == [0, 7081, 65535]
