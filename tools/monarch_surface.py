"""Record the public API surface of PyTorch Monarch from its Python source, as JSON.

    python -m tools.monarch_surface SRC_ROOT LABEL OUT.json [--source TEXT]

SRC_ROOT is the folder that holds the ``monarch/`` package: an unzipped torchmonarch
wheel, or the ``python/`` folder of a clone of github.com/meta-pytorch/monarch. Monarch
is never imported (it needs its native extension); the source is read with ``ast``.

For each module in MODULES the record holds ``__all__`` and, for each name in it, where
the name is defined (``from X import Y as Z`` chains are followed through the tree; a
name from ``monarch._rust_bindings`` through its ``.pyi`` stub), its kind and its
signature: a function's parameters, a class's constructor parameters, bases, public
methods and properties (inherited ones from classes in the tree are marked with
``inherited_from``) and public class attributes (enum members, fields). Kinds:
"class", "function", "constant", "module", "native" (a compiled name with no stub to
describe it) and "unresolved" (the chain leaves the tree, or meets a name it cannot
follow). tests/compat/README.md says how the checked-in records were made.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODULES = ("monarch.actor", "monarch.job", "monarch.rdma", "monarch.config")
NATIVE = "monarch._rust_bindings"
MAX_DEPTH = 40  # import hops before a chain counts as a cycle

Json = dict[str, Any]
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Import:
    """A name bound by an import: ``module`` itself, or its attribute ``name``."""

    module: str
    name: str | None = None


Binding = ast.stmt | Import


@dataclass(frozen=True)
class Found:
    """Where a chain of imports ends: the module, the name there and its definition."""

    kind: str
    module: str
    name: str | None = None
    node: Binding | None = None

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module


def _flatten(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a body, with if/else branches and try blocks opened. A try's
    ``except`` fallbacks come first, so that what the ``try`` binds wins."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _flatten(stmt.body)
            yield from _flatten(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for handler in stmt.handlers:
                yield from _flatten(handler.body)
            yield from _flatten(stmt.body + stmt.orelse + stmt.finalbody)
        else:
            yield stmt


def _decorators(node: ast.ClassDef | FunctionNode) -> list[str]:
    """The decorators' names without call arguments or module: ``overload``, ``setter``."""
    names = []
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        names.append(ast.unparse(target).rsplit(".", 1)[-1])
    return names


def _pick(bindings: list[Binding]) -> Binding:
    """The binding that counts: the last, but among functions the implementation of
    an ``@overload`` set (the last def without ``@overload``), else the first."""
    last = bindings[-1]
    if not isinstance(last, FunctionNode):
        return last
    defs = [b for b in bindings if isinstance(b, FunctionNode)]
    impls = [d for d in defs if "overload" not in _decorators(d)]
    return impls[-1] if impls else defs[0]


def _methods(cls: ast.ClassDef) -> dict[str, FunctionNode]:
    """The defs of a class body by name (overloads resolved; property setters left out)."""
    defs: dict[str, list[Binding]] = {}
    for stmt in _flatten(cls.body):
        if isinstance(stmt, FunctionNode) and not {"setter", "deleter"} & set(_decorators(stmt)):
            defs.setdefault(stmt.name, []).append(stmt)
    return {name: fn for name, fns in defs.items() if isinstance(fn := _pick(fns), FunctionNode)}


def _targets(stmt: ast.stmt) -> list[str]:
    """The plain names an assignment statement (``=``, annotated, ``+=``) binds."""
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign | ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    return []


def _param(name: str, kind: str, default: bool) -> Json:
    return {"name": name, "kind": kind, "default": default}


def _params(args: ast.arguments, drop_first: bool = False) -> list[Json]:
    """The parameters of a def in order, as inspect.Parameter kinds; ``drop_first``
    leaves out self or cls."""
    positional = [(a, "POSITIONAL_ONLY") for a in args.posonlyargs]
    positional += [(a, "POSITIONAL_OR_KEYWORD") for a in args.args]
    first_default = len(positional) - len(args.defaults)
    out = [_param(a.arg, kind, i >= first_default) for i, (a, kind) in enumerate(positional)]
    if drop_first and positional:
        out = out[1:]
    if args.vararg:
        out.append(_param(args.vararg.arg, "VAR_POSITIONAL", False))
    out += [_param(a.arg, "KEYWORD_ONLY", d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        out.append(_param(args.kwarg.arg, "VAR_KEYWORD", False))
    return out


def _fields(cls: ast.ClassDef, kw_only: bool) -> list[Json]:
    """A dataclass's or NamedTuple's constructor parameters, from its annotated fields."""
    out = []
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        annotation = ast.unparse(stmt.annotation)
        if "ClassVar" in annotation:
            continue
        if annotation.endswith("KW_ONLY"):
            kw_only = True
            continue
        default = stmt.value is not None
        if isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func).endswith("field"):
            keywords = {k.arg: k.value for k in stmt.value.keywords}
            init = keywords.get("init")
            if isinstance(init, ast.Constant) and init.value is False:
                continue
            default = "default" in keywords or "default_factory" in keywords
        kind = "KEYWORD_ONLY" if kw_only else "POSITIONAL_OR_KEYWORD"
        out.append(_param(stmt.target.id, kind, default))
    return out


def _dataclass_kw_only(cls: ast.ClassDef) -> bool | None:
    """None if ``cls`` is not a @dataclass, else whether its fields are keyword-only."""
    for dec in cls.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if ast.unparse(target).rsplit(".", 1)[-1] == "dataclass":
            keywords = dec.keywords if isinstance(dec, ast.Call) else []
            return any(k.arg == "kw_only" and ast.unparse(k.value) == "True" for k in keywords)
    return None


def _constant(node: Binding) -> Json:
    """A constant's record, with its value where that is a plain literal."""
    value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
    if isinstance(value, ast.Constant) and isinstance(value.value, str | int | float | None):
        return {"kind": "constant", "value": value.value}
    return {"kind": "constant"}


class Tree:
    """The Python source under one root, read and resolved without importing it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._bindings: dict[str, dict[str, list[Binding]] | None] = {}

    def _file(self, module: str) -> Path | None:
        """A module's source or stub, as Python finds it (a package before a module)."""
        base = self.root.joinpath(*module.split("."))
        candidates = [
            base / "__init__.py",
            base.with_suffix(".py"),
            base / "__init__.pyi",
            base.with_suffix(".pyi"),
        ]
        return next((path for path in candidates if path.is_file()), None)

    def _parse(self, module: str) -> ast.Module | None:
        path = self._file(module)
        return ast.parse(path.read_text(), str(path)) if path else None

    def _is_package(self, module: str) -> bool:
        path = self._file(module)
        return path is not None and path.stem == "__init__"

    def bindings(self, module: str) -> dict[str, list[Binding]] | None:
        """Each name a module binds at its top level, with every binding in order;
        None if the module has no source in the tree."""
        if module not in self._bindings:
            tree = self._parse(module)
            self._bindings[module] = None if tree is None else self._collect(module, tree)
        return self._bindings[module]

    def _collect(self, module: str, tree: ast.Module) -> dict[str, list[Binding]]:
        found: dict[str, list[Binding]] = {}
        for stmt in _flatten(tree.body):
            if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                found.setdefault(stmt.name, []).append(stmt)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                for target in _targets(stmt):
                    found.setdefault(target, []).append(stmt)
            elif isinstance(stmt, ast.ImportFrom):
                source = self._absolute(module, stmt)
                for alias in stmt.names:
                    found.setdefault(alias.asname or alias.name, []).append(Import(source, alias.name))
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    found.setdefault(bound, []).append(Import(alias.name if alias.asname else bound))
        return found

    def _absolute(self, module: str, stmt: ast.ImportFrom) -> str:
        """The module a ``from ... import`` names, with relative imports made absolute."""
        if not stmt.level:
            return stmt.module or ""
        parts = module.split(".")
        keep = len(parts) - stmt.level + (1 if self._is_package(module) else 0)
        return ".".join(parts[:keep] + ([stmt.module] if stmt.module else []))

    def resolve(self, module: str, name: str, depth: int = 0) -> Found:
        """Where ``module.name`` is defined, following imports and aliases."""
        bindings = self.bindings(module) or {}
        if depth > MAX_DEPTH:
            return Found("unresolved", module, name)
        if name not in bindings:
            if self._file(f"{module}.{name}"):
                return Found("module", f"{module}.{name}")
            return Found("native" if module.startswith(NATIVE) else "unresolved", module, name)
        node = _pick(bindings[name])
        if isinstance(node, Import):
            if node.name is None:
                return Found("module", node.module)
            return self.resolve(node.module, node.name, depth + 1)
        if isinstance(node, ast.ClassDef):
            return Found("class", module, name, node)
        if isinstance(node, FunctionNode):
            return Found("function", module, name, node)
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Name | ast.Attribute):
            aliased = self.resolve_expr(module, value, depth + 1)
            if aliased.kind != "unresolved":
                return aliased
        return Found("constant", module, name, node)

    def resolve_expr(self, module: str, expr: ast.expr, depth: int = 0) -> Found:
        """Where a name or dotted name used in ``module`` is defined (``Base[T]`` as ``Base``)."""
        if isinstance(expr, ast.Subscript):
            return self.resolve_expr(module, expr.value, depth)
        if isinstance(expr, ast.Name):
            return self.resolve(module, expr.id, depth)
        if isinstance(expr, ast.Attribute):
            owner = self.resolve_expr(module, expr.value, depth)
            if owner.kind == "module":
                return self.resolve(owner.module, expr.attr, depth + 1)
        return Found("unresolved", module, ast.unparse(expr))

    def _bases(self, cls: Found) -> Iterator[Found]:
        """The bases of a class that are classes defined in the tree, in order."""
        assert isinstance(cls.node, ast.ClassDef)
        for base in cls.node.bases:
            found = self.resolve_expr(cls.module, base)
            if found.kind == "class":
                yield found

    def _constructor(self, cls: Found, depth: int = 0) -> tuple[list[Json], str | None]:
        """A class's constructor parameters and the class they come from."""
        node = cls.node
        assert isinstance(node, ast.ClassDef)
        methods = _methods(node)
        init = methods.get("__init__") or methods.get("__new__")
        if init:
            return _params(init.args, drop_first=True), cls.qualname
        kw_only = _dataclass_kw_only(node)
        if kw_only is not None or any(ast.unparse(b).endswith("NamedTuple") for b in node.bases):
            return _fields(node, bool(kw_only)), cls.qualname
        if depth < MAX_DEPTH:
            for base in self._bases(cls):
                params, source = self._constructor(base, depth + 1)
                if source:
                    return params, source
        return [], None

    def _public_methods(self, cls: Found, depth: int = 0) -> Json:
        """Public methods and properties of a class, then those it inherits from the tree."""
        assert isinstance(cls.node, ast.ClassDef)
        out: Json = {}
        for name, fn in _methods(cls.node).items():
            if not name.startswith("_"):
                decorators = _decorators(fn)
                kind = next((k for k in ("classmethod", "staticmethod") if k in decorators), "method")
                if {"property", "cached_property"} & set(decorators):
                    kind = "property"
                params = _params(fn.args, drop_first=kind != "staticmethod")
                out[name] = {"kind": kind, "async": isinstance(fn, ast.AsyncFunctionDef), "params": params}
        if depth < MAX_DEPTH:
            for base in self._bases(cls):
                for name, method in self._public_methods(base, depth + 1).items():
                    out.setdefault(name, {"inherited_from": base.qualname, **method})
        return out

    def describe(self, found: Found) -> Json:
        """The JSON record of a resolved name."""
        record: Json = {"defined_in": found.qualname}
        node = found.node
        if isinstance(node, ast.ClassDef):
            params, source = self._constructor(found)
            attributes = [
                name
                for stmt in node.body
                if isinstance(stmt, ast.Assign | ast.AnnAssign)
                for name in _targets(stmt)
                if not name.startswith("_")
            ]
            record.update(kind="class", bases=[ast.unparse(b) for b in node.bases], init=params)
            record.update(init_from=source, methods=self._public_methods(found), attributes=attributes)
        elif isinstance(node, FunctionNode):
            record.update(kind="function", params=_params(node.args))
            record["async"] = isinstance(node, ast.AsyncFunctionDef)
        elif found.kind == "constant" and node is not None:
            record.update(_constant(node))
        else:
            record["kind"] = found.kind
        return record

    def all_names(self, module: str) -> list[str]:
        """A module's ``__all__``, from its assignments and ``+=`` extensions."""
        tree = self._parse(module)
        if tree is None:
            raise SystemExit(f"{module}: no source under {self.root}")
        names: list[str] = []
        for stmt in _flatten(tree.body):
            if "__all__" in _targets(stmt) and isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
                value = list(ast.literal_eval(stmt.value)) if stmt.value else []
                names = names + value if isinstance(stmt, ast.AugAssign) else value
        return names


def surface(root: Path, label: str, source: str) -> Json:
    """The record of every module in MODULES under ``root``."""
    tree = Tree(root)
    modules = {}
    for module in MODULES:
        names = tree.all_names(module)
        described = {name: tree.describe(tree.resolve(module, name)) for name in names}
        modules[module] = {"all": names, "names": described}
    return {"label": label, "source": source, "modules": modules}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.monarch_surface", description=__doc__.split("\n")[0]
    )
    parser.add_argument("src_root", type=Path, help="the folder that holds the monarch/ package")
    parser.add_argument("label", help="the record's label, e.g. 0.7.0 or main")
    parser.add_argument("out", type=Path, help="the JSON file to write")
    parser.add_argument("--source", default="", help="where the source came from (wheel, commit)")
    args = parser.parse_args()
    record = surface(args.src_root, args.label, args.source)
    args.out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
