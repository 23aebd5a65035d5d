"""A small offline reader for this repository's Bicep templates.

Nothing here compiles Bicep or talks to Azure. The files are parsed with the pinned
tree-sitter Bicep grammar, then *evaluated* far enough to answer the questions the infra
tests ask: which resources exist (with module calls, loops and conditions expanded),
what their names and properties are, and which app settings the function app gets.

Values only Azure knows at deployment time (a resource id, ``uniqueString(...)``, a
module output that comes from one) are kept as :class:`Unknown`, which remembers the
source text and, for calls such as ``guid(...)``, the evaluated arguments. Anything the
reader does not understand also becomes :class:`Unknown`, never a guess.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import tree_sitter
import tree_sitter_bicep

_LANGUAGE = tree_sitter.Language(tree_sitter_bicep.language())


def parser() -> tree_sitter.Parser:
    return tree_sitter.Parser(_LANGUAGE)


def parse(source: str | bytes) -> tree_sitter.Tree:
    return parser().parse(source.encode() if isinstance(source, str) else source)


def syntax_errors(source: str | bytes) -> list[str]:
    """``line:column: text`` of every ERROR or MISSING node; empty when the file parses."""
    data = source.encode() if isinstance(source, str) else source
    errors: list[str] = []

    def visit(node: tree_sitter.Node) -> None:
        if node.type == "ERROR" or node.is_missing:
            row, col = node.start_point
            snippet = data[node.start_byte : node.end_byte].decode(errors="replace")[:60]
            errors.append(f"{row + 1}:{col + 1}: {'missing ' + node.type if node.is_missing else repr(snippet)}")
        elif node.has_error:
            for child in node.children:
                visit(child)

    tree = parse(data)
    if tree.root_node.has_error:
        visit(tree.root_node)
        errors = errors or ["parse error"]
    return errors


# --- values --------------------------------------------------------------------------


@dataclass(frozen=True)
class Unknown:
    """A value known only at deployment time (or not understood here)."""

    text: str
    func: str | None = None
    args: tuple = ()

    def __str__(self) -> str:
        return f"<{self.text}>"


@dataclass(frozen=True)
class ResourceId:
    """``symbol.id`` of a resource declared in the same file."""

    symbol: str
    file: str


@dataclass(eq=False)
class Resource:
    symbol: str
    type: str  # e.g. Microsoft.ServiceBus/namespaces/queues
    api_version: str
    body: dict
    file: Path
    existing: bool = False
    condition: str | None = None  # source text of an if() that could not be decided
    parent: Resource | None = None

    @property
    def name(self) -> Any:
        return self.body.get("name")

    @property
    def properties(self) -> dict:
        return self.body.get("properties") or {}

    def __repr__(self) -> str:
        return f"Resource({self.symbol!r}, {self.type}@{self.api_version}, name={self.name!r})"


@dataclass(frozen=True)
class ResourceRef:
    """A reference to a declared resource (``scope: storage``, ``parent: namespace``)."""

    symbol: str
    file: str
    type: str


@dataclass
class Deployment:
    """The evaluated result of one template and every module it calls."""

    file: Path
    resources: list[Resource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    modules: dict[str, list[Deployment]] = field(default_factory=dict)
    #: The parameters it was evaluated with (a module's, as its caller passed them).
    params: dict[str, Any] = field(default_factory=dict)

    def all_resources(self) -> list[Resource]:
        found = list(self.resources)
        for deployments in self.modules.values():
            for deployment in deployments:
                found.extend(deployment.all_resources())
        return found

    def deployments_of(self, file_name: str) -> list[Deployment]:
        """This deployment and every nested module deployment made from ``file_name``."""
        found = [self] if self.file.name == file_name else []
        for deployments in self.modules.values():
            for deployment in deployments:
                found.extend(deployment.deployments_of(file_name))
        return found

    def of_type(self, resource_type: str, *, existing: bool = False) -> list[Resource]:
        wanted = resource_type.lower()
        return [r for r in self.all_resources() if r.type.lower() == wanted and r.existing == existing]


class BicepError(Exception):
    """The template uses something this reader refuses to guess about."""


# --- declarations ------------------------------------------------------------------------


def _text(data: bytes, node: tree_sitter.Node) -> str:
    return data[node.start_byte : node.end_byte].decode()


def _named(node: tree_sitter.Node) -> list[tree_sitter.Node]:
    return [c for c in node.named_children if c.type != "comment"]


@dataclass
class _Decl:
    kind: str  # param, var, resource, module, output
    name: str
    node: tree_sitter.Node  # the value / body node
    type_text: str | None = None  # resource type string or module path
    existing: bool = False
    parent: _Decl | None = None


class Template:
    """The declarations of one ``.bicep`` file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.data = self.path.read_bytes()
        self.tree = parse(self.data)
        if self.tree.root_node.has_error:
            raise BicepError(f"{self.path}: {syntax_errors(self.data)}")
        self.target_scope = "resourceGroup"
        self.params: dict[str, _Decl] = {}
        self.vars: dict[str, _Decl] = {}
        self.resources: dict[str, _Decl] = {}
        self.modules: dict[str, _Decl] = {}
        self.outputs: dict[str, _Decl] = {}
        for node in self.tree.root_node.named_children:
            self._declare(node, parent=None)

    def text(self, node: tree_sitter.Node) -> str:
        return _text(self.data, node)

    def _string_literal(self, node: tree_sitter.Node) -> str:
        parts = _named(node)
        if any(p.type == "interpolation" for p in parts):
            raise BicepError(f"{self.path}: interpolated type or path {self.text(node)}")
        return "".join(self.text(p) for p in parts)

    def _declare(self, node: tree_sitter.Node, parent: _Decl | None) -> None:
        kind = node.type
        children = _named(node)
        if kind == "target_scope_assignment":
            self.target_scope = self._string_literal(children[-1])
        elif kind == "parameter_declaration":
            name = self.text(children[0])
            default = children[2] if len(children) > 2 else None
            self.params[name] = _Decl("param", name, default)
        elif kind == "variable_declaration":
            self.vars[self.text(children[0])] = _Decl("var", self.text(children[0]), children[-1])
        elif kind == "output_declaration":
            self.outputs[self.text(children[0])] = _Decl("output", self.text(children[0]), children[-1])
        elif kind == "module_declaration":
            name = self.text(children[0])
            self.modules[name] = _Decl("module", name, children[-1], self._string_literal(children[1]))
        elif kind == "resource_declaration":
            name = self.text(children[0])
            type_text = self._string_literal(children[1])
            existing = any(c.type == "existing" for c in node.children)
            decl = _Decl("resource", name, children[-1], type_text, existing, parent)
            if parent is not None:
                decl.type_text = _child_type(parent.type_text, type_text)
            self.resources[name] = decl
            for body in _bodies(children[-1]):
                for prop in body.named_children:
                    if prop.type == "object_property":
                        for inner in prop.named_children:
                            if inner.type == "resource_declaration":
                                self._declare(inner, parent=decl)


def _child_type(parent_type: str, child: str) -> str:
    """Full ``type@version`` of a nested child resource declared with a relative type."""
    parent_name, _, parent_version = parent_type.partition("@")
    child_name, _, child_version = child.partition("@")
    return f"{parent_name}/{child_name}@{child_version or parent_version}"


def _bodies(node: tree_sitter.Node) -> list[tree_sitter.Node]:
    """The object node(s) of a resource body, through ``[for ...]`` and ``if ()``."""
    if node.type == "object":
        return [node]
    if node.type in ("for_statement", "if_statement"):
        return [b for child in node.named_children for b in _bodies(child) if child.type in ("object", "if_statement")]
    return []


# --- evaluation ----------------------------------------------------------------------


#: Functions that take lambdas and are evaluated here (others that do are not used).
_LAMBDA_FUNCTIONS = {"toObject", "map", "filter"}

_FUNCTION_UNKNOWN = {
    "guid", "uniqueString", "subscription", "resourceGroup", "tenant", "deployment", "environment",
    "resourceId", "reference", "utcNow", "newGuid", "managementGroup",
}


class _Scope:
    def __init__(self, template: Template, params: dict[str, Any]):
        self.t = template
        self.given = params
        self.memo: dict[tuple[str, str], Any] = {}
        self.module_results: dict[str, list[Deployment]] = {}
        self.resolving: set[tuple[str, str]] = set()

    # names
    def lookup(self, name: str, local: dict[str, Any]) -> Any:
        if name in local:
            return local[name]
        if name in self.t.params:
            return self._memo("param", name, lambda: self._param(name))
        if name in self.t.vars:
            return self._memo("var", name, lambda: self.eval(self.t.vars[name].node, {}))
        if name in self.t.resources:
            decl = self.t.resources[name]
            return ResourceRef(name, str(self.t.path), decl.type_text.partition("@")[0])
        if name in self.t.modules:
            return _ModuleRef(name)
        raise BicepError(f"{self.t.path}: unknown identifier {name!r}")

    def _memo(self, kind: str, name: str, compute):
        key = (kind, name)
        if key not in self.memo:
            if key in self.resolving:
                raise BicepError(f"{self.t.path}: cycle through {kind} {name}")
            self.resolving.add(key)
            try:
                self.memo[key] = compute()
            finally:
                self.resolving.discard(key)
        return self.memo[key]

    def _param(self, name: str) -> Any:
        if name in self.given:
            return self.given[name]
        default = self.t.params[name].node
        if default is None:
            return Unknown(f"param {name}")
        return self.eval(default, {})

    # expressions
    def eval(self, node: tree_sitter.Node, local: dict[str, Any]) -> Any:
        t = node.type
        text = self.t.text(node)
        if t == "string":
            return self._string(node, local)
        if t == "number":
            return int(text)
        if t == "boolean":
            return text == "true"
        if t == "null":
            return None
        if t == "identifier":
            return self.lookup(text, local)
        if t == "parenthesized_expression":
            return self.eval(_named(node)[0], local)
        if t == "object":
            return self._object(node, local)
        if t == "array":
            return [self.eval(c, local) for c in _named(node)]
        if t == "for_statement":
            return self._for(node, local, lambda body, scope: self.eval(body, scope))
        if t == "member_expression":
            return self._member(node, local)
        if t == "subscript_expression":
            obj, index = (self.eval(c, local) for c in _named(node)[:2])
            if isinstance(obj, Unknown) or isinstance(index, Unknown):
                return Unknown(text)
            if isinstance(obj, _ModuleRef):  # one instance of a module loop: modules[i].outputs
                return _ModuleRef(obj.symbol, index)
            if isinstance(obj, ResourceRef):  # one instance of a resource loop: only Azure knows it
                return Unknown(text)
            return obj[index]
        if t == "call_expression":
            return self._call(node, local)
        if t == "ternary_expression":
            cond = self.eval(node.child_by_field_name("condition"), local)
            if isinstance(cond, Unknown):
                return Unknown(text)
            branch = "consequence" if cond else "alternative"
            return self.eval(node.child_by_field_name(branch), local)
        if t == "unary_expression":
            value = self.eval(node.child_by_field_name("argument"), local)
            op = self.t.text(node.child_by_field_name("operator"))
            if isinstance(value, Unknown):
                return Unknown(text)
            return (not value) if op == "!" else -value
        if t == "binary_expression":
            return self._binary(node, local)
        if t == "lambda_expression" and local.get(("lambda body", node.id)):
            return self.eval(_named(node)[-1], local)
        return Unknown(text)

    def _string(self, node: tree_sitter.Node, local: dict[str, Any]) -> Any:
        parts: list[Any] = []
        for child in _named(node):
            if child.type == "interpolation":
                parts.append(self.eval(_named(child)[0], local))
            elif child.type == "escape_sequence":
                parts.append(_ESCAPES.get(self.t.text(child), self.t.text(child)))
            else:
                parts.append(self.t.text(child))
        if any(isinstance(p, (Unknown, ResourceId, ResourceRef)) for p in parts):
            return Unknown(self.t.text(node))
        return "".join(str(p).lower() if isinstance(p, bool) else str(p) for p in parts)

    def _object(self, node: tree_sitter.Node, local: dict[str, Any]) -> dict:
        result: dict[str, Any] = {}
        for prop in node.named_children:
            if prop.type != "object_property":
                continue
            parts = _named(prop)
            if parts[0].type == "resource_declaration":
                continue  # nested child resource: declared, not a property
            key_node, value_node = parts[0], parts[-1]
            key = self.t.text(key_node) if key_node.type == "identifier" else self.eval(key_node, local)
            if isinstance(key, Unknown):
                key = key.text
            result[key] = self.eval(value_node, local)
        return result

    def _member(self, node: tree_sitter.Node, local: dict[str, Any]) -> Any:
        obj = self.eval(node.child_by_field_name("object"), local)
        prop = self.t.text(node.child_by_field_name("property"))
        text = self.t.text(node)
        if isinstance(obj, dict):
            if prop not in obj:
                raise BicepError(f"{self.t.path}: {text}: no property {prop!r} in {sorted(obj)}")
            return obj[prop]
        if isinstance(obj, ResourceRef):
            if prop == "id":
                return ResourceId(obj.symbol, obj.file)
            if prop == "name":
                decl = self.t.resources[obj.symbol]
                if decl.node.type == "object":
                    name_node = _property_node(decl.node, "name")
                    if name_node is not None:
                        return self.eval(name_node, {})
            return Unknown(text)
        if isinstance(obj, _ModuleRef):
            if prop != "outputs":
                return Unknown(text)
            results = self.module_results.get(obj.symbol) or self.run_module(obj.symbol)
            if obj.index is not None:
                return results[obj.index].outputs if 0 <= obj.index < len(results) else Unknown(text)
            if len(results) != 1:
                return Unknown(text)
            return results[0].outputs
        return Unknown(text)

    def _call(self, node: tree_sitter.Node, local: dict[str, Any]) -> Any:
        fn_node = node.child_by_field_name("function")
        name = self.t.text(fn_node)
        text = self.t.text(node)
        args_node = node.child_by_field_name("arguments")
        args = [self._argument(a, local) for a in _named(args_node)] if args_node is not None else []
        if name in _LAMBDA_FUNCTIONS:
            return self._lambda_call(name, text, args)
        if any(isinstance(a, _Lambda) for a in args):
            raise BicepError(f"{self.t.path}: a lambda is passed to {name}(), which takes none: {text}")
        if name in _FUNCTION_UNKNOWN or fn_node.type != "identifier":
            return Unknown(text, name, tuple(args))
        unknown = any(isinstance(a, (Unknown, ResourceId, ResourceRef)) for a in args)
        if name == "empty":
            return Unknown(text) if unknown else len(args[0] or "") == 0
        if name == "union":
            if unknown or not all(isinstance(a, dict) for a in args):
                return Unknown(text, name, tuple(args))
            merged: dict = {}
            for a in args:
                merged.update(a)
            return merged
        if name == "concat":
            if unknown:
                return Unknown(text, name, tuple(args))
            if all(isinstance(a, list) for a in args):
                return [x for a in args for x in a]
            return "".join(str(a) for a in args)
        if unknown:
            return Unknown(text, name, tuple(args))
        if name == "string" and isinstance(args[0], (dict, list)):
            # Bicep writes an object or array as JSON; one with a deploy-time value inside
            # stays Unknown, its evaluated argument kept (e.g. a workbook's items).
            if not _known(args[0]):
                return Unknown(text, name, tuple(args))
            return json.dumps(args[0], separators=(",", ":"))
        simple = {
            "string": lambda v: str(v).lower() if isinstance(v, bool) else str(v),
            "int": int,
            "toLower": str.lower,
            "toUpper": str.upper,
            "length": len,
            "take": lambda v, n: v[:n],
            "range": lambda start, count: list(range(start, start + count)),
            "join": lambda items, delimiter: delimiter.join(str(item) for item in items),
            "contains": lambda container, item: item in container,
            "replace": str.replace,
            "format": lambda fmt, *values: re.sub(r"\{(\d+)\}", lambda m: str(values[int(m.group(1))]), fmt),
            "subscriptionResourceId": lambda *parts: "/subscriptions/{subscriptionId}/providers/"
            + parts[0]
            + "/"
            + "/".join(parts[1:]),
        }
        if name in simple:
            return simple[name](*args)
        return Unknown(text, name, tuple(args))

    def _argument(self, node: tree_sitter.Node, local: dict[str, Any]) -> Any:
        lam = _leftmost_lambda(node)
        if lam is None:
            return self.eval(node, local)
        params_node = _named(lam)[0]
        names = _named(params_node) if params_node.type == "parenthesized_expression" else [params_node]
        if not all(n.type == "identifier" for n in names):
            raise BicepError(f"{self.t.path}: lambda parameters not understood: {self.t.text(lam)}")
        return _Lambda(tuple(self.t.text(n) for n in names), lam, node, dict(local))

    def apply(self, fn: _Lambda, *values: Any) -> Any:
        scope = dict(fn.closure, **dict(zip(fn.params, values)))
        scope[("lambda body", fn.node.id)] = True
        return self.eval(fn.body, scope)

    def _lambda_call(self, name: str, text: str, args: list) -> Any:
        items, lambdas = args[0], args[1:]
        if isinstance(items, Unknown):
            return Unknown(text, name, tuple(args))
        if not lambdas or not all(isinstance(f, _Lambda) for f in lambdas):
            raise BicepError(f"{self.t.path}: {name}() needs lambdas: {text}")
        if not isinstance(items, list):
            raise BicepError(f"{self.t.path}: {name}() of a non-array: {text}")

        def call(fn: _Lambda, item: Any, index: int) -> Any:
            return self.apply(fn, item, index) if len(fn.params) > 1 else self.apply(fn, item)

        if name == "map":
            return [call(lambdas[0], item, i) for i, item in enumerate(items)]
        if name == "filter":
            kept = [(item, call(lambdas[0], item, i)) for i, item in enumerate(items)]
            if any(isinstance(keep, Unknown) for _, keep in kept):
                return Unknown(text, name, tuple(args))
            return [item for item, keep in kept if keep]
        # toObject(array, key lambda[, value lambda])
        result: dict[str, Any] = {}
        for item in items:
            key = self.apply(lambdas[0], item)
            if not isinstance(key, str):
                return Unknown(text, name, tuple(args))
            result[key] = self.apply(lambdas[1], item) if len(lambdas) > 1 else item
        return result

    def _binary(self, node: tree_sitter.Node, local: dict[str, Any]) -> Any:
        op = self.t.text(node.child_by_field_name("operator"))
        left = self.eval(node.child_by_field_name("left"), local)
        if op == "&&" and left is False:
            return False
        if op == "||" and left is True:
            return True
        right = self.eval(node.child_by_field_name("right"), local)
        if op == "??":
            return right if left is None else left
        if isinstance(left, Unknown) or isinstance(right, Unknown):
            return Unknown(self.t.text(node))
        ops = {
            "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
            "&&": lambda a, b: a and b, "||": lambda a, b: a or b,
            "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
            "/": lambda a, b: a // b, "%": lambda a, b: a % b,
            "<": lambda a, b: a < b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b,
        }
        if op not in ops:
            return Unknown(self.t.text(node))
        return ops[op](left, right)

    def _for(self, node: tree_sitter.Node, local: dict[str, Any], body_fn) -> list:
        named = _named(node)
        if named[0].type == "for_loop_parameters":
            loop_vars = [self.t.text(c) for c in _named(named[0])]
        else:
            loop_vars = [self.t.text(named[0])]
        iterable = self.eval(named[1], local)
        body = named[-1]
        if isinstance(iterable, Unknown):
            scope = dict(local, **{v: Unknown(f"{v} in {iterable.text}") for v in loop_vars})
            return [body_fn(body, scope)]
        results = []
        for index, item in enumerate(iterable):
            scope = dict(local)
            scope[loop_vars[0]] = item
            if len(loop_vars) > 1:
                scope[loop_vars[1]] = index
            results.append(body_fn(body, scope))
        return results

    # declarations -> instances
    def instances(self, decl: _Decl) -> list[tuple[dict[str, Any], str | None]]:
        """(loop scope, undecided condition) for each instance the declaration deploys."""
        node = decl.node
        found: list[tuple[dict[str, Any], str | None]] = []

        def visit(body: tree_sitter.Node, scope: dict[str, Any]):
            if body.type == "if_statement":
                cond_node, inner = _named(body)[0], _named(body)[-1]
                cond = self.eval(cond_node, scope)
                if cond is False:
                    return None
                found.append((scope, self.t.text(cond_node) if isinstance(cond, Unknown) else None))
                return inner
            found.append((scope, None))
            return body

        if node.type == "for_statement":
            self._for(node, {}, visit)
        else:
            visit(node, {})
        return found

    def run_module(self, symbol: str) -> list[Deployment]:
        if symbol in self.module_results:
            return self.module_results[symbol]
        decl = self.t.modules[symbol]
        path = (self.t.path.parent / decl.type_text).resolve()
        if decl.type_text.startswith(("br:", "br/", "ts:", "ts/")) or not path.exists():
            raise BicepError(f"{self.t.path}: module {symbol} is not a local file: {decl.type_text}")
        results = []
        for scope, _condition in self.instances(decl):
            body = _body_object(decl.node)
            params_node = _property_node(body, "params")
            params = self.eval(params_node, scope) if params_node is not None else {}
            results.append(evaluate(path, params))
        self.module_results[symbol] = results
        return results


def _known(value: Any) -> bool:
    """No deploy-time value anywhere inside."""
    if isinstance(value, dict):
        return all(_known(v) for v in value.values())
    if isinstance(value, list):
        return all(_known(v) for v in value)
    return not isinstance(value, (Unknown, ResourceId, ResourceRef))


class _ModuleRef:
    def __init__(self, symbol: str, index: int | None = None):
        self.symbol = symbol
        self.index = index


@dataclass(frozen=True)
class _Lambda:
    """``x => body`` passed to toObject/map/filter: applied by :meth:`_Scope.apply`.

    The pinned grammar binds ``=>`` tighter than Bicep does: ``r => r.url`` parses as
    ``(r => r).url``. So the lambda is the whole argument (``body``), and the
    ``lambda_expression`` node inside it (``node``) stands for its own body.
    """

    params: tuple[str, ...]
    node: tree_sitter.Node
    body: tree_sitter.Node
    closure: dict


def _leftmost_lambda(node: tree_sitter.Node) -> tree_sitter.Node | None:
    """The lambda_expression an argument starts with (itself, or mis-nested under it)."""
    while node is not None:
        if node.type == "lambda_expression":
            return node
        named = _named(node)
        if not named or named[0].start_byte != node.start_byte:
            return None
        node = named[0]
    return None


_ESCAPES = {"\\'": "'", "\\\\": "\\", "\\n": "\n", "\\r": "\r", "\\t": "\t", "\\$": "$"}


def _body_object(node: tree_sitter.Node) -> tree_sitter.Node:
    while node.type != "object":
        node = _named(node)[-1]
    return node


def _property_node(obj: tree_sitter.Node, key: str) -> tree_sitter.Node | None:
    for prop in obj.named_children:
        if prop.type == "object_property":
            parts = _named(prop)
            if parts[0].type == "identifier" and parts[0].text.decode() == key:
                return parts[-1]
    return None


@cache
def template(path: Path) -> Template:
    return Template(path)


def evaluate(path: Path | str, params: dict[str, Any] | None = None) -> Deployment:
    """Evaluate ``path`` with ``params`` (defaults for the rest), modules included."""
    path = Path(path).resolve()
    tpl = template(path)
    unknown_params = set(params or {}) - set(tpl.params)
    if unknown_params:
        raise BicepError(f"{path}: no such parameters {sorted(unknown_params)}")
    scope = _Scope(tpl, dict(params or {}))
    deployment = Deployment(path, params=dict(params or {}))
    by_symbol: dict[str, list[Resource]] = {}
    for symbol, decl in tpl.resources.items():
        type_name, _, version = decl.type_text.partition("@")
        for loop_scope, condition in scope.instances(decl):
            body = scope.eval(_body_object(decl.node), loop_scope)
            resource = Resource(symbol, type_name, version, body, path, decl.existing, condition)
            by_symbol.setdefault(symbol, []).append(resource)
            deployment.resources.append(resource)
    for resource in deployment.resources:
        parent_decl = tpl.resources[resource.symbol].parent
        parent_ref = resource.body.get("parent")
        if parent_decl is not None:
            parent_symbol = parent_decl.name
        else:
            parent_symbol = parent_ref.symbol if isinstance(parent_ref, ResourceRef) else None
        if parent_symbol and len(by_symbol.get(parent_symbol, [])) == 1:
            resource.parent = by_symbol[parent_symbol][0]
    for symbol in tpl.modules:
        deployment.modules[symbol] = scope.run_module(symbol)
    for name, decl in tpl.outputs.items():
        deployment.outputs[name] = scope.eval(decl.node, {})
    return deployment


# --- helpers the tests share ------------------------------------------------------------

_DURATION = re.compile(r"^P(?:(?P<days>\d+)D)?(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)S)?)?$")


def iso_duration(text: str):
    """An ISO 8601 duration of days/hours/minutes/seconds (``P14D``, ``PT1M``) as a timedelta."""
    from datetime import timedelta

    match = _DURATION.match(text)
    if not match or text in ("P", "PT"):
        raise ValueError(f"not a day-time ISO 8601 duration: {text!r}")
    return timedelta(**{k: int(v) for k, v in match.groupdict().items() if v})
