"""Imports point down the layers only, and the README's Layout table matches the tree.

Layers, bottom to top (a module may import its own layer and the ones below):

1. ``tools.*``: generic development tools; they import nothing first-party outside
   ``tools/`` (a tool's tests may use another tool, e.g. the local host's tests run
   against the Service Bus emulator).
2. the app, with its own order: ``core`` (pure) <- ``adapters`` <- ``scheduler``,
   ``agents``, ``supervisor``, ``api`` <- ``function_app``.
3. ``ordersctl`` and the local stack, ``devtools.*`` (but the demo).
4. ``devtools.demo`` and ``benchmarks.*`` (the soak among them).
5. ``tests.*``: anything.

Every import counts: at the top of a module, inside a function, under
``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import ROOT

#: Module prefix -> layer (the longest prefix that matches decides).
LAYERS: dict[str, float] = {
    "tools": 1,
    "core": 2.0,
    "adapters": 2.1,
    "scheduler": 2.2,
    "agents": 2.2,
    "supervisor": 2.2,
    "api": 2.2,
    "function_app": 2.3,
    "ordersctl": 3,
    "devtools": 3,
    "devtools.demo": 4,
    "benchmarks": 4,
    "tests": 5,
}
LAYER_NAMES = {1: "tools", 2.0: "core", 2.1: "adapters", 2.2: "functions", 2.3: "function_app", 3: "local stack",
               4: "demo/benchmarks", 5: "tests"}
#: Packages of layer 1: they may import only themselves.
TOOL_PACKAGES = ("tools",)


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.importer} imports {self.target}"


def python_files() -> list[str]:
    """Every first-party .py file: tracked, or new and not git-ignored."""
    result = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, f"git ls-files failed (the test needs a git checkout): {result.stderr}"
    return sorted({path for path in result.stdout.split("\0") if path and (ROOT / path).is_file()})


def module_name(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: str, modules: set[str], top_level: set[str]) -> list[Import]:
    """The first-party imports of one file, each resolved to the most specific module."""
    importer = module_name(path)
    package = importer if path.endswith("__init__.py") else importer.rpartition(".")[0]
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"), filename=path)
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}" if source else alias.name
                targets.append(submodule if submodule in modules else source)
        for target in targets:
            if target and target.split(".")[0] in top_level:
                found.append(Import(importer, target, path, node.lineno))
    return found


def layer_of(module: str) -> float:
    best = max((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")),
               key=len, default=None)
    assert best is not None, f"no layer for module {module}: add its package to LAYERS in {Path(__file__).name}"
    return LAYERS[best]


def tool_package(module: str) -> str | None:
    """The layer-1 package a module belongs to (``tools``), or None."""
    return next((p for p in TOOL_PACKAGES if module == p or module.startswith(p + ".")), None)


@pytest.fixture(scope="module")
def graph() -> list[Import]:
    files = python_files()
    modules = {module_name(path) for path in files}
    top_level = {module.split(".")[0] for module in modules}
    return [edge for path in files for edge in _imports(path, modules, top_level)]


def test_the_import_graph_is_found(graph):
    importers = {edge.importer for edge in graph}
    for expected in ("function_app", "scheduler.blueprint", "adapters.store", "devtools.demo", "benchmarks.soak",
                     "tools.funchost.host"):
        assert expected in importers, f"no first-party import found in {expected}"


def test_imports_point_down_the_layers(graph):
    wrong = [
        f"{edge} ({LAYER_NAMES[layer_of(edge.importer)]} -> {LAYER_NAMES[layer_of(edge.target)]})"
        for edge in graph
        if layer_of(edge.importer) < layer_of(edge.target)
    ]
    assert not wrong, "imports from a lower layer to a higher one:\n" + "\n".join(wrong)


def test_tools_import_nothing_first_party_but_tools(graph):
    wrong = [
        str(edge) for edge in graph
        if (package := tool_package(edge.importer)) is not None and tool_package(edge.target) != package
    ]
    assert not wrong, "a tool imports first-party code outside tools/:\n" + "\n".join(wrong)


def test_core_imports_no_azure_package():
    wrong = []
    for path in python_files():
        if not path.startswith("core/"):
            continue
        for node in ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            wrong += [f"{path}:{node.lineno}: {name}" for name in names if name.split(".")[0] == "azure"]
    assert not wrong, "core/ must stay pure (no azure.* import):\n" + "\n".join(wrong)


def test_no_import_cycle(graph):
    edges: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], Import] = {}
    for edge in graph:
        if edge.importer != edge.target:
            edges[edge.importer].add(edge.target)
            where.setdefault((edge.importer, edge.target), edge)
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                cycles.append(" -> ".join(cycle) + "\n    " + "\n    ".join(
                    str(where[(a, b)]) for a, b in zip(cycle, cycle[1:])))
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


# --- the README's Layout table ----------------------------------------------------------


def layout_paths() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert section, "README.md has no '## Layout' section"
    paths = []
    for line in section.group(1).splitlines():
        if not line.startswith("|") or set(line) <= set("|- "):
            continue
        first = line.split("|")[1]
        paths += re.findall(r"`([^`]+)`", first)
    assert paths, "the Layout table lists nothing"
    return paths


def test_readme_layout_lists_every_top_level_folder_with_code():
    listed = layout_paths()
    missing = [path for path in listed if not (ROOT / path.rstrip("/")).exists()]
    assert not missing, f"README's Layout table lists paths that do not exist: {missing}"
    tops = {path.rstrip("/").split("/")[0] for path in listed}
    with_code = {path.split("/")[0] for path in python_files()}
    unlisted = sorted(with_code - tops)
    assert not unlisted, f"README's Layout table does not list these top-level folders/files with code: {unlisted}"
