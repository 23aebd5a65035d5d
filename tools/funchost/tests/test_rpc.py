"""FunctionRpc: the committed modules are what the vendored proto files generate, and both sides speak them."""

from __future__ import annotations

from pathlib import Path

from tools.funchost.rpc import generate, protos
from tools.funchost.worker import parse_args


def test_the_committed_modules_are_what_the_proto_files_generate(tmp_path):
    written = generate.generate(tmp_path)
    assert {path.relative_to(tmp_path).as_posix() for path in written} == {
        "FunctionRpc_pb2.py", "FunctionRpc_pb2_grpc.py", "identity/ClaimsIdentityRpc_pb2.py",
        "identity/ClaimsIdentityRpc_pb2_grpc.py", "shared/NullableTypes_pb2.py", "shared/NullableTypes_pb2_grpc.py",
    }
    for path in written:
        committed = Path(generate.HERE, path.relative_to(tmp_path))
        assert committed.read_text() == path.read_text(), f"{committed.name}: run python -m tools.funchost.rpc.generate"


def test_the_proto_files_are_microsofts_v1_10_0():
    proto = (generate.PROTO_DIR / "FunctionRpc.proto").read_text()
    # v1.10.0 added the capabilities' update strategy to FunctionEnvironmentReloadResponse.
    assert "CapabilitiesUpdateStrategy capabilities_update_strategy = 4;" in proto
    assert "MIT License" in (generate.PROTO_DIR / "LICENSE").read_text()


def test_the_namespace_has_what_the_runtime_takes_from_it():
    # Every name azure-functions-runtime 1.3.0 reads from the protos it is handed.
    for name in ("TypedData", "StatusResult", "WorkerInitResponse", "FunctionEnvironmentReloadResponse",
                 "RpcRetryOptions", "NullableDouble", "NullableString", "NullableBool", "NullableTimestamp",
                 "InvocationResponse", "WorkerMetadata", "RpcHttpCookie", "RpcHttp", "RpcFunctionMetadata",
                 "RpcException", "ParameterBinding", "FunctionMetadataResponse", "FunctionLoadResponse",
                 "BindingInfo", "StreamingMessage", "FunctionRpcStub", "add_FunctionRpcServicer_to_server"):
        assert hasattr(protos, name), name
    assert protos.BindingInfo.out == 1 and protos.RpcHttpCookie.SameSite.ExplicitNone == 3


def test_the_worker_takes_the_command_line_the_host_gives_it():
    old = parse_args(["--host", "127.0.0.1", "--port", "5000", "--workerId", "w", "--requestId", "r",
                      "--grpcMaxMessageLength", "100"])
    assert (old.host, old.port, old.worker_id, old.request_id, old.max_message_length) == ("127.0.0.1", 5000, "w",
                                                                                          "r", 100)
    both = parse_args(["--host", "127.0.0.1", "--port", "5000", "--workerId", "w", "--requestId", "r",
                       "--functions-uri", "http://127.0.0.1:6000/", "--functions-worker-id", "w2",
                       "--functions-request-id", "r2", "--functions-grpc-max-message-length", "200"])
    assert (both.port, both.worker_id, both.request_id, both.max_message_length) == (6000, "w2", "r2", 200)
