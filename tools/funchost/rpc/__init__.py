"""FunctionRpc, the gRPC protocol between the Functions host and a language worker.

``proto/`` holds Microsoft's proto files, unchanged: Azure/azure-functions-language-worker-protobuf
at tag ``v1.10.0-protofile`` (MIT, ``proto/LICENSE``), as the Functions host vendors them
(Azure/azure-functions-host, ``src/WebJobs.Script.Grpc/azure-functions-language-worker-protobuf``,
commit eaaab6ed8 "Update protobuf file to v1.10.0"). The ``*_pb2`` modules beside them are
generated from those files by ``generate.py`` with the pinned grpcio-tools.

``protos`` is the namespace both sides use, the messages by name as in Microsoft's Python
worker (``protos.StreamingMessage``, ``protos.TypedData``, ...): the host side imports it,
and the worker side hands it to ``azure-functions-runtime``, which takes its protos injected
rather than importing any.
"""

from types import SimpleNamespace

from . import FunctionRpc_pb2, FunctionRpc_pb2_grpc
from .shared import NullableTypes_pb2
from .identity import ClaimsIdentityRpc_pb2


def _namespace() -> SimpleNamespace:
    names: dict = {}
    for module in (NullableTypes_pb2, ClaimsIdentityRpc_pb2, FunctionRpc_pb2):
        names.update(
            (name, value) for name, value in vars(module).items() if name[:1].isupper() and name != "DESCRIPTOR"
        )
    names.update(
        FunctionRpcStub=FunctionRpc_pb2_grpc.FunctionRpcStub,
        FunctionRpcServicer=FunctionRpc_pb2_grpc.FunctionRpcServicer,
        add_FunctionRpcServicer_to_server=FunctionRpc_pb2_grpc.add_FunctionRpcServicer_to_server,
    )
    return SimpleNamespace(**names)


#: Every message, enum and the service's stub and servicer, by name.
protos = _namespace()

__all__ = ["protos"]
