"""The package's layers (docs/architecture.md): a module imports only modules of its
own layer or of lower ones, and the modules import each other without loops.

Every import counts, also those inside functions and those only for type checkers;
there is no list of exceptions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "monarch_kernel"

#: Bottom to top. A module belongs to the first entry that is it or a package above it.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "base",
        [
            "monarch_kernel.errors",
            "monarch_kernel._caller",
            "monarch_kernel._shutdown",
            "monarch_kernel._native",
            "monarch_kernel._origin",
            "monarch_kernel._lazy",
            "monarch_kernel._ranks",
            "monarch_kernel._wire",
            "monarch_kernel.v1",
        ],
    ),
    ("control", ["monarch_kernel.control"]),
    ("hosts", ["monarch_kernel.hosts"]),
    ("mesh", ["monarch_kernel.mesh", "monarch_kernel.actor"]),
    ("torch", ["monarch_kernel.torch"]),
    ("tensor", ["monarch_kernel.tensor"]),
    ("worker", ["monarch_kernel.worker"]),
    ("controller", ["monarch_kernel.controller"]),
    (
        "public",
        [
            "monarch_kernel._compat",
            "monarch_kernel._job_commands",
            "monarch_kernel._port_forward",
            "monarch_kernel._shell",
            "monarch_kernel.job",
            "monarch_kernel.rdma",
            "monarch_kernel.config",
            "monarch_kernel.spmd",
            "monarch_kernel",
        ],
    ),
    ("kernel", ["monarch_kernel.kernel", "monarch_kernel.server"]),
    ("commands", ["monarch_kernel.cli", "monarch_kernel.__main__"]),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _layer(module: str) -> int:
    for i, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "monarch_kernel" and module.startswith(prefix + ".")):
                return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to docs/architecture.md)")


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The monarch_kernel modules an import statement loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "monarch_kernel"]
    base = node.module or ""
    if node.level:
        package = importer if is_package else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    if base.split(".")[0] != "monarch_kernel":
        return []
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        out.append(sub if sub in MODULES or sub == "monarch_kernel._native" else base)
    return out


def _imports(module: str, runtime_only: bool) -> set[str]:
    """What ``module`` imports: everywhere, or (``runtime_only``) less what only type
    checkers see (``if TYPE_CHECKING:`` blocks)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    skip: set[int] = set()
    if runtime_only:
        for n in ast.walk(tree):
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                skip.update(id(m) for m in ast.walk(n))
    nodes = [n for n in ast.walk(tree) if id(n) not in skip]
    found: set[str] = set()
    for n in nodes:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            found.update(_resolve(module, is_package, n))
    found.discard(module)
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_nothing_from_a_higher_layer(module):
    mine = _layer(module)
    higher = sorted(
        f"{target} (layer {LAYERS[_layer(target)][0]})"
        for target in _imports(module, runtime_only=False)
        if _layer(target) > mine
    )
    assert not higher, f"{module} (layer {LAYERS[mine][0]}) imports from higher layers: {higher}"


#: What the Jupyter-facing layer may use: the public package (jobs included), the
#: controller's facade and the base modules (never the mesh API's or the worker's internals).
KERNEL_MAY_IMPORT = {
    "monarch_kernel",
    "monarch_kernel.job",
    "monarch_kernel.spmd",
    "monarch_kernel.controller",
    "monarch_kernel.errors",
    "monarch_kernel._lazy",
    "monarch_kernel._native",
    "monarch_kernel._origin",
    "monarch_kernel._ranks",
    "monarch_kernel._wire",
}


def _package(module: str) -> str:
    """The package of the layers' map a module belongs to: ``monarch_kernel.X`` for
    the modules of a subpackage ``X``, ``monarch_kernel`` for the top-level modules."""
    if module == "monarch_kernel.actor":
        # The mesh layer's public module for actors (Monarch's ``monarch.actor``): of
        # the mesh package, whose ``_actor_mesh`` it is imported by.
        return "monarch_kernel.mesh"
    parts = module.split(".")
    if len(parts) > 2 or MODULES[module].name == "__init__.py":
        return ".".join(parts[:2])
    return "monarch_kernel"


def _lazy_targets(module: str) -> set[str]:
    """The modules a package's ``_LAZY`` table (PEP 562) names: imports made on first use."""
    tree = ast.parse(MODULES[module].read_text())
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "_LAZY" and n.value is not None:
            out.update(str(v).partition(":")[0] for v in ast.literal_eval(n.value).values())
    return out


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_uses_another_package_only_through_its_facade(module):
    """A package's ``_x`` modules are its own: every other module, of any layer, uses
    what the package's ``__init__`` exports (eagerly or on first use)."""
    mine = _package(module)
    past = sorted(
        t
        for t in _imports(module, runtime_only=False) | _lazy_targets(module)
        if t in MODULES
        and _package(t) != mine
        and _package(t) != "monarch_kernel"
        and t.rsplit(".", 1)[-1].startswith("_")
        and not t.endswith(".__main__")
    )
    assert not past, f"{module} reaches into other packages' modules, past their facades: {past}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("monarch_kernel.kernel")))
def test_the_kernel_uses_only_the_public_package_and_the_controller(module):
    other = sorted(
        t
        for t in _imports(module, runtime_only=False)
        if t not in KERNEL_MAY_IMPORT and not t.startswith("monarch_kernel.kernel")
    )
    assert not other, f"{module} reaches past the public package and the controller: {other}"


def test_the_modules_import_each_other_without_loops():
    # Imports inside functions count too: a loop broken only by importing late is a
    # loop; so do imports for type checkers only (a loop of types is still a knot).
    graph = {m: {t for t in _imports(m, runtime_only=False) if t in MODULES} for m in MODULES}
    # A package's __init__ is loaded before any of its modules; that edge is not a loop.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if m.startswith(t + "."):
                continue  # a module importing names its own package re-exports
            if state.get(t) == 1:
                loop = stack[stack.index(t) :] + [t]
                raise AssertionError("import loop: " + " -> ".join(loop))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_every_layer_names_modules_that_exist():
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            assert prefix == "monarch_kernel._native" or prefix in MODULES, (
                f"layer {name}: {prefix} does not exist"
            )
