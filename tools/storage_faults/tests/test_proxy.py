"""The proxy in front of Azurite, driven by the real SDKs over real sockets: what passes
unchanged, and what each fault looks like to the SDK (status, error code, body format,
whether the request was applied)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError, ServiceResponseError
from azure.data.tables import TableServiceClient, UpdateMode
from azure.storage.queue import ExponentialRetry, QueueClient

from tools.storage_faults import CONTROL_PATH, StorageFaults, start_in_thread

IMPORT_ROOT = Path(__file__).resolve().parents[3]


def table(connection_string: str, name: str):
    return TableServiceClient.from_connection_string(connection_string).create_table_if_not_exists(name)


def rows(client) -> dict[str, int]:
    return {row["RowKey"]: row["X"] for row in client.list_entities()}


def test_requests_pass_unchanged_and_are_counted(proxy, name):
    client = table(proxy.connection_string, name)
    client.create_entity({"PartitionKey": "p", "RowKey": "r", "X": 1})
    client.update_entity({"PartitionKey": "p", "RowKey": "r", "X": 2}, mode=UpdateMode.MERGE)
    client.submit_transaction([("upsert", {"PartitionKey": "p", "RowKey": "s", "X": 3})])
    assert rows(client) == {"r": 2, "s": 3}
    queue = QueueClient.from_connection_string(proxy.connection_string, name)
    queue.create_queue()
    queue.send_message("hello")
    assert [m.content for m in queue.receive_messages()] == ["hello"]
    counts = proxy.counts()
    assert counts["requests"]["table"] >= 5 and counts["requests"]["queue"] >= 3
    assert counts["faults"] == {"503": 0, "500-applied": 0, "reset-applied": 0, "latency": 0}


def test_server_busy_on_tables_is_azures_json_error_and_nothing_is_applied(proxy, name):
    client = table(proxy.connection_string, name)
    proxy.inject("503", service="table")
    with pytest.raises(HttpResponseError) as raised:
        client.create_entity({"PartitionKey": "p", "RowKey": "r", "X": 1}, retry_total=0)
    error = raised.value
    assert error.status_code == 503
    assert error.response.headers["x-ms-error-code"] == "ServerBusy"
    assert error.response.headers["Content-Type"].startswith("application/json;odata=minimalmetadata")
    body = json.loads(error.response.text())
    assert body["odata.error"]["code"] == "ServerBusy" and body["odata.error"]["message"]["lang"] == "en-US"
    assert body["odata.error"]["message"]["value"].startswith(
        "The server is currently unable to receive requests. Please retry your request.\nRequestId:"
    )
    assert rows(client) == {}
    assert proxy.counts()["faults"]["503"] == 1


def test_server_busy_on_queues_is_azures_xml_error_and_the_sdk_retries_it(proxy, name):
    queue = QueueClient.from_connection_string(proxy.connection_string, name)
    queue.create_queue()
    proxy.inject("503", service="queue")
    with pytest.raises(HttpResponseError) as raised:
        queue.send_message("x", retry_total=0)
    assert raised.value.status_code == 503 and raised.value.error_code == "ServerBusy"
    assert raised.value.response.text().startswith('<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>')
    proxy.inject("503", service="queue")
    quick = QueueClient.from_connection_string(
        proxy.connection_string, name, retry_policy=ExponentialRetry(initial_backoff=0, increment_base=1, retry_total=1)
    )
    quick.send_message("y")  # sent again, accepted
    assert [m.content for m in queue.receive_messages()] == ["y"]


def test_a_scripted_pass_lets_requests_through_and_aims_the_fault_after_it(proxy, name):
    client = table(proxy.connection_string, name)
    proxy.inject("pass", service="table", times=2)
    proxy.inject("503", service="table")
    client.upsert_entity({"PartitionKey": "p", "RowKey": "a", "X": 1}, retry_total=0)
    client.upsert_entity({"PartitionKey": "p", "RowKey": "b", "X": 2}, retry_total=0)
    with pytest.raises(HttpResponseError) as raised:
        client.upsert_entity({"PartitionKey": "p", "RowKey": "c", "X": 3}, retry_total=0)
    assert raised.value.status_code == 503
    assert rows(client) == {"a": 1, "b": 2}
    assert proxy.counts()["faults"]["503"] == 1 and "pass" not in proxy.counts()["faults"]


def test_operation_timed_out_after_the_write_was_applied(proxy, name):
    client = table(proxy.connection_string, name)
    proxy.inject("500-applied", service="table")
    with pytest.raises(HttpResponseError) as raised:
        client.upsert_entity({"PartitionKey": "p", "RowKey": "r", "X": 1}, retry_total=0)
    assert raised.value.status_code == 500 and "ErrorCode:OperationTimedOut" in str(raised.value)
    assert rows(client) == {"r": 1}, "the write was not applied"


def test_an_applied_create_retried_by_the_sdk_meets_itself_as_409(proxy, name):
    client = table(proxy.connection_string, name)
    proxy.inject("500-applied", service="table", method="POST")
    with pytest.raises(HttpResponseError) as raised:
        client.create_entity({"PartitionKey": "p", "RowKey": "r", "X": 1})  # the SDK's retry policy as is
    assert raised.value.status_code == 409 and raised.value.response.headers["x-ms-error-code"] == "EntityAlreadyExists"
    assert rows(client) == {"r": 1}


def test_a_connection_dropped_after_the_write_was_applied(proxy, name):
    client = table(proxy.connection_string, name)
    proxy.inject("reset-applied", service="table", method="POST")
    with pytest.raises(ServiceResponseError):  # a POST is not retried after a dropped connection
        client.create_entity({"PartitionKey": "p", "RowKey": "r", "X": 1})
    assert rows(client) == {"r": 1}, "the write was not applied"
    client.create_entity({"PartitionKey": "p", "RowKey": "s", "X": 2})  # the proxy serves on
    assert proxy.counts()["faults"]["reset-applied"] == 1


def test_a_connection_dropped_before_forwarding_applies_nothing_and_the_sdk_raises_for_a_patch(proxy, name):
    client = table(proxy.connection_string, name)
    client.create_entity({"PartitionKey": "p", "RowKey": "r", "X": 1})
    proxy.inject("reset", service="table", method="PATCH")
    with pytest.raises(ServiceResponseError):  # azure-core retries a PATCH after a 5xx, not after no answer
        client.update_entity({"PartitionKey": "p", "RowKey": "r", "X": 2}, mode=UpdateMode.MERGE)
    assert rows(client) == {"r": 1}, "the dropped write was applied"
    assert proxy.counts()["faults"]["reset"] == 1


def test_a_latency_spike_delays_the_request(proxy, name):
    client = table(proxy.connection_string, name)
    proxy.set_faults(StorageFaults(latency_seconds=0.4))
    proxy.inject("latency", service="table")
    started = time.monotonic()
    client.upsert_entity({"PartitionKey": "p", "RowKey": "r", "X": 1})
    assert time.monotonic() - started >= 0.4
    assert proxy.counts()["faults"]["latency"] == 1


def test_faults_at_a_rate_are_drawn_per_request_and_counted_per_kind(proxy, name):
    client = table(proxy.connection_string, name)
    proxy.set_faults(StorageFaults(busy=0.3, applied_500=0.2))
    seen = {"ServerBusy": 0, "OperationTimedOut": 0, None: 0}
    for i in range(60):
        try:
            client.upsert_entity({"PartitionKey": "p", "RowKey": f"r{i}", "X": i}, retry_total=0)
            seen[None] += 1
        except HttpResponseError as error:
            seen[error.response.headers["x-ms-error-code"]] += 1
    faults = proxy.counts()["faults"]
    assert (faults["503"], faults["500-applied"]) == (seen["ServerBusy"], seen["OperationTimedOut"])
    assert 5 <= seen["ServerBusy"] <= 35 and 2 <= seen["OperationTimedOut"] <= 25
    assert len(rows(client)) == seen[None] + seen["OperationTimedOut"]  # 500-applied rows were written


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("503=0.02,500-applied=0.01,reset-applied=0.01,latency=0.05:0.5",
         StorageFaults(busy=0.02, applied_500=0.01, reset_applied=0.01, latency=0.05, latency_seconds=0.5)),
        ("none", StorageFaults()),
        ("latency=0.1", StorageFaults(latency=0.1)),
    ],
)
def test_the_fault_spec_round_trips(text, expected):
    assert StorageFaults.parse(text) == expected
    assert StorageFaults.parse(expected.to_arg()) == expected


@pytest.mark.parametrize("text", ["503", "busy=0.1", "503=2", "503=x", "503=0.1:3", "503=0.6,500-applied=0.6"])
def test_a_bad_fault_spec_is_refused_with_the_reason(text):
    with pytest.raises(ValueError, match=r"expected|rate|between|exceed"):
        StorageFaults.parse(text)


def test_draws_follow_the_rates():
    faults, rng = StorageFaults(busy=0.1, reset_applied=0.1, latency=0.2), random.Random(3)
    draws = [faults.draw(rng) for _ in range(5000)]
    assert 400 < sum(fault == "503" for fault, _ in draws) < 600
    assert 400 < sum(fault == "reset-applied" for fault, _ in draws) < 600
    assert 850 < sum(spike for _, spike in draws) < 1150


def test_the_command_prints_the_proxied_connection_string_and_answers_its_counts(azurite, name):
    process = subprocess.Popen(
        [sys.executable, "-m", "tools.storage_faults", "--connection-string", azurite.connection_string,
         "--faults", "503=0,latency=0:0.1"],
        cwd=IMPORT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        connection_string = process.stdout.readline().strip()
        assert "TableEndpoint=http://127.0.0.1:" in connection_string and "AccountName=devstoreaccount1" in connection_string
        assert azurite.connection_string.split("BlobEndpoint=")[1].split(";")[0] in connection_string  # blob as is
        client = table(connection_string, name)
        client.upsert_entity({"PartitionKey": "p", "RowKey": "r", "X": 1})
        endpoint = connection_string.split("TableEndpoint=")[1].split(";")[0].rsplit("/", 1)[0]
        put = urllib.request.Request(endpoint + CONTROL_PATH, method="PUT", data=json.dumps({"faults": "503=1"}).encode())
        assert json.load(urllib.request.urlopen(put))["rates"].startswith("503=1,")
        with pytest.raises(HttpResponseError):
            client.upsert_entity({"PartitionKey": "p", "RowKey": "s", "X": 1}, retry_total=0)
        counts = json.load(urllib.request.urlopen(endpoint + CONTROL_PATH))
        assert counts["requests"]["table"] >= 3 and counts["faults"]["503"] == 1
        assert counts["faults_by_service"] == {"table": {"503": 1}}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(10) == 0


def test_the_command_refuses_a_bad_fault_spec():
    result = subprocess.run([sys.executable, "-m", "tools.storage_faults", "--connection-string", "x", "--faults", "503"],
                            cwd=IMPORT_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "KIND=RATE" in result.stderr


def test_an_upstream_that_fails_drops_the_clients_connection_and_is_counted_apart(name):
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    proxy = start_in_thread({"table": f"http://127.0.0.1:{port}"})
    try:
        client = TableServiceClient.from_connection_string(
            f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
            f"TableEndpoint={proxy.endpoints['table']}/devstoreaccount1;"
        ).get_table_client(name)
        with pytest.raises(ServiceResponseError):
            client.create_entity({"PartitionKey": "p", "RowKey": "r"})
        counts = proxy.counts()
        assert counts["upstream_errors"] == 1 and counts["faults"] == {
            "503": 0, "500-applied": 0, "reset-applied": 0, "latency": 0}
    finally:
        proxy.stop()
