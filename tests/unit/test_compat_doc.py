"""docs/monarch-compat.md stays true against Monarch itself: every public name of
``monarch.actor``, ``monarch.job``, ``monarch.rdma`` and ``monarch.config`` in
torchmonarch 0.7.0 and in Monarch's main branch (their ``__all__`` and signatures,
recorded from their source in tests/compat/ by tools/monarch_surface.py) is listed
with a status; each listed name exists here; a name listed ``same`` takes Monarch's
parameters (names, and positional order); every public name of ``monarch_kernel``
and ``monarch_kernel.job`` is in the page; and the tensor engine's names of
``monarch`` that this package keeps are listed."""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

import monarch_kernel
import monarch_kernel.job

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "monarch-compat.md"
RECORDS = sorted((ROOT / "tests" / "compat").glob("monarch-*.json"))

#: Monarch's module, the module here that stands for it, and the page's section.
MODULES = {
    "monarch.actor": ("monarch_kernel", "`monarch.actor`"),
    "monarch.job": ("monarch_kernel.job", "`monarch.job`"),
    "monarch.rdma": ("monarch_kernel.rdma", "`monarch.rdma`"),
    "monarch.config": ("monarch_kernel.config", "`monarch.config`"),
}
#: Monarch's tensor engine (``import monarch``), the names this package keeps.
MONARCH_TENSOR = [
    "coalescing", "fetch_shard", "get_active_mesh", "get_active_stream", "grad_generator",
    "inspect", "no_mesh", "reduce", "reduce_", "remote", "RemoteException", "show",
    "slice_mesh", "Stream", "Tensor", "to_mesh",
]  # fmt: skip
STATUSES = {"same", "different", "not here"}
#: Classes that the runtime makes and user code never constructs (``spawn_procs``,
#: ``this_host()``, ``Channel.open()``): their constructors are internal in both.
MADE_BY_THE_RUNTIME = {"HostMesh", "ProcMesh", "Port", "PortReceiver"}


def _records() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in RECORDS]


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _table_names(section: str) -> dict[str, str]:
    """``name -> status`` of a section's table rows (``| `name` | status | ...``)."""
    rows = re.findall(r"^\| `([A-Za-z_][A-Za-z_0-9]*)` \| ([a-z ]+?) \|", section, re.MULTILINE)
    return dict(rows)


def _table_notes(section: str) -> dict[str, str]:
    """``name -> notes`` of a section's table rows."""
    rows = re.findall(r"^\| `([A-Za-z_][A-Za-z_0-9]*)` \| [a-z ]+? \| (.*) \|$", section, re.MULTILINE)
    return dict(rows)


def _mentioned(section: str) -> set[str]:
    return set(re.findall(r"`([A-Za-z_][A-Za-z_0-9]*)`", section))


def _monarch_names(module: str) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Each name of Monarch's ``module`` in any recorded version: [(version, entry)]."""
    names: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for rec in _records():
        entry = rec["modules"][module]
        for name in entry["all"]:
            names.setdefault(name, []).append((rec["label"], entry["names"][name]))
    return names


def test_the_records_are_of_both_versions():
    assert sorted(r["label"] for r in _records()) == ["0.7.0", "main"]
    for rec in _records():
        assert sorted(rec["modules"]) == sorted(MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_name_of_each_monarch_module_is_listed_with_a_status(module):
    ours, title = MODULES[module]
    listed = _table_names(_section(title))
    assert sorted(set(_monarch_names(module)) - set(listed)) == [], f"not in the page's {title} table"
    assert set(listed.values()) <= STATUSES


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_listed_name_exists_here(module):
    ours, title = MODULES[module]
    here = importlib.import_module(ours)
    missing = [n for n in _table_names(_section(title)) if not hasattr(here, n)]
    assert missing == [], f"docs/monarch-compat.md lists these under {title}; {ours} lacks them"


def _ours_params(thing: Any) -> list[inspect.Parameter]:
    target = thing.__init__ if inspect.isclass(thing) else thing
    params = list(inspect.signature(target).parameters.values())
    return params[1:] if inspect.isclass(thing) and params and params[0].name == "self" else params


def _signature_differences(theirs: list[dict[str, Any]], ours: list[inspect.Parameter]) -> list[str]:
    """How ``ours`` fails to take Monarch's parameters ``theirs``: each by name, the
    positional ones in Monarch's order."""
    by_name = {p.name: p for p in ours}
    takes_any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ours)
    positional = [p.name for p in ours if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    wrong = []
    for i, p in enumerate(q for q in theirs if q["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")):
        if i >= len(positional) or positional[i] != p["name"]:
            wrong.append(f"positional parameter {i} is {p['name']!r} in Monarch")
    for p in theirs:
        if p["kind"] == "KEYWORD_ONLY" and p["name"] not in by_name and not takes_any_keyword:
            wrong.append(f"no keyword {p['name']!r}")
        if p["kind"].startswith("VAR_") and not any(q.kind.name == p["kind"] for q in ours):
            wrong.append(f"no {'*' if p['kind'] == 'VAR_POSITIONAL' else '**'}{p['name']}")
    required = [
        p.name for p in ours if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    optional_there = {p["name"] for p in theirs if p["default"]}
    wrong += [
        f"{name!r} is required here, optional in Monarch" for name in required if name in optional_there
    ]
    return wrong


def _same_names() -> list[tuple[str, str]]:
    return [
        (module, name)
        for module, (_, title) in sorted(MODULES.items())
        for name, status in sorted(_table_names(_section(title)).items())
        if status == "same"
    ]


@pytest.mark.parametrize(("module", "name"), _same_names())
def test_a_name_listed_same_takes_monarchs_parameters(module, name):
    ours = getattr(importlib.import_module(MODULES[module][0]), name)
    for version, entry in _monarch_names(module).get(name, []):
        if entry["kind"] == "function":
            theirs = entry["params"]
        elif entry["kind"] == "class" and name not in MADE_BY_THE_RUNTIME:
            theirs = entry["init"]
        else:
            continue
        if not callable(ours):
            continue
        wrong = _signature_differences(theirs, _ours_params(ours))
        assert wrong == [], f"{module}.{name} of Monarch {version}: {wrong} (list it as different, with why)"


def _classes_here() -> list[tuple[str, str]]:
    return [
        (module, name)
        for module, (_, title) in sorted(MODULES.items())
        for name, status in sorted(_table_names(_section(title)).items())
        if status != "not here"
        and any(e["kind"] == "class" and e["methods"] for _, e in _monarch_names(module).get(name, []))
    ]


@pytest.mark.parametrize(("module", "name"), _classes_here())
def test_each_method_of_a_monarch_class_is_here_or_its_row_says_why_not(module, name):
    # A method Monarch's class has (its own or inherited, in either version) exists
    # here with Monarch's parameters, or the class's row names it (`method`) and says
    # how it differs.
    ours_module, title = MODULES[module]
    ours = getattr(importlib.import_module(ours_module), name)
    notes = _table_notes(_section("`monarch.actor`")) | _table_notes(_section(title))
    # (what a base class's row says holds for its subclasses: an actor's, Actor's)
    rows = [notes.get(k.__name__, "") for k in inspect.getmro(ours)]
    noted = set(re.findall(r"`\.?([A-Za-z_][A-Za-z_0-9]*)", " ".join(rows)))
    declared = {a for k in inspect.getmro(ours) for a in getattr(k, "__annotations__", {})}
    unexplained = []
    for version, entry in _monarch_names(module)[name]:
        for method, m in sorted(entry.get("methods", {}).items()):
            if method in noted:
                continue
            mine = inspect.getattr_static(ours, method, None)
            if mine is None and method in declared:  # an attribute of each instance
                continue
            if mine is None:
                unexplained.append(f"{method} (missing; Monarch {version})")
                continue
            if m["kind"] == "property" or isinstance(mine, property) or not callable(getattr(ours, method)):
                continue
            try:
                params = list(inspect.signature(getattr(ours, method)).parameters.values())
            except (TypeError, ValueError):
                continue
            if params and params[0].name in ("self", "cls"):
                params = params[1:]
            wrong = _signature_differences(m["params"], params)
            if wrong:
                unexplained.append(f"{method} ({'; '.join(wrong)}; Monarch {version})")
    assert sorted(set(unexplained)) == [], (
        f"{module}.{name}: add these to {ours_module}.{name}, or name them in its row of "
        "docs/monarch-compat.md with why"
    )


def test_every_tensor_engine_name_of_monarch_is_listed_with_a_status():
    listed = _table_names(_section("`monarch` (distributed tensors)"))
    assert sorted(set(MONARCH_TENSOR) - set(listed)) == []
    assert set(listed.values()) <= STATUSES
    for name in listed:
        assert hasattr(monarch_kernel, name), f"docs/monarch-compat.md lists {name}; monarch_kernel lacks it"


def test_every_public_name_of_monarch_kernel_is_in_the_page():
    mentioned = _mentioned(DOC.read_text())
    assert sorted(set(monarch_kernel.__all__) - mentioned) == []
    assert sorted(set(monarch_kernel.job.__all__) - mentioned) == []


def test_names_not_here_raise_not_implemented_only_when_used():
    for ours, title in MODULES.values():
        here = importlib.import_module(ours)
        for name, status in _table_names(_section(title)).items():
            thing = getattr(here, name)
            if status != "not here" or not callable(thing):
                continue
            with pytest.raises(NotImplementedError, match=r"\w"):
                thing()
