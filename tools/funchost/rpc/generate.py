"""Generate the FunctionRpc modules from the vendored .proto files, as Microsoft's Python worker builds them.

``python -m tools.funchost.rpc.generate`` runs ``grpc_tools.protoc`` over ``proto/`` (the
files of Azure/azure-functions-language-worker-protobuf, see ``proto/README.md`` and
``../README.md``) one file at a time, as the worker's build does
(Azure/azure-functions-python-worker, ``tests/test_setup.py``, ``gen_grpc``), then makes the
generated imports relative to this package (the worker makes them absolute to its own:
protocolbuffers/protobuf#1491), so the package works wherever it is mounted. The
generated files are committed; ``tools/funchost/tests/test_rpc.py`` generates them again
with the pinned grpcio-tools and checks that nothing changed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_DIR = HERE / "proto"
#: In dependency order, as the worker's build lists them.
PROTOS = ("shared/NullableTypes.proto", "identity/ClaimsIdentityRpc.proto", "FunctionRpc.proto")


def _relative_imports(path: Path, depth: int) -> None:
    """``import X_pb2 as ...`` and ``from identity import X_pb2 as ...`` made relative to this package."""
    up = "." * (depth + 1)
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^import (\w+_pb2) as", rf"from {up} import \1 as", text, flags=re.MULTILINE)
    text = re.sub(r"^from (shared|identity) import (\w+_pb2) as", rf"from {up}\1 import \2 as", text, flags=re.MULTILINE)
    path.write_text(text, encoding="utf-8")


def generate(out_dir: Path) -> list[Path]:
    """Write the generated modules under ``out_dir`` (the package layout: ``shared/``, ``identity/``)."""
    from grpc_tools import protoc  # noqa: PLC0415 - a development dependency, only needed here

    include = str(Path(protoc.__file__).parent / "_proto")  # google/protobuf/*.proto shipped with grpcio-tools
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as staging:
        for proto in PROTOS:
            code = protoc.main(
                ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={staging}",
                 f"--grpc_python_out={staging}", str(PROTO_DIR / proto)]
            )
            if code != 0:
                raise RuntimeError(f"grpc_tools.protoc failed on {proto} (exit code {code})")
        for produced in sorted(Path(staging).rglob("*.py")):
            relative = produced.relative_to(staging)
            _relative_imports(produced, len(relative.parts) - 1)
            target = out_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(produced, target)
            written.append(target)
    return written


def main() -> int:
    for path in generate(HERE):
        print(path.relative_to(HERE))
    subprocess.run([sys.executable, "-c", f"import {__package__}"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
