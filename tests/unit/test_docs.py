"""The project's own documents stay true to the code: every link inside the
repository resolves, nothing points at a document outside it, and
docs/invariants.md lists exactly the invariants the code states, each with tests
that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = [
    *sorted((ROOT / "monarch_kernel").rglob("*.py")),
    *sorted((ROOT / "native" / "src").rglob("*.rs")),
]
#: An invariant's ID as the code names it ("SUPERVISE-1: ...", "(FENCE-1)"); not
#: names of other things that look alike.
STATED = re.compile(r"(?<![-\w])(?!SHA-|UTF-|NET-)([A-Z]{2,}-\d+)\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_of_a_document_resolves_inside_the_repository(doc):
    text = doc.read_text()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://", target):
            continue
        path = (doc.parent / target).resolve()
        assert path.exists(), f"{doc.name} links to {target}, which does not exist"
        assert ROOT in path.parents or path == ROOT, f"{doc.name} links outside the repository: {target}"


def test_nothing_points_at_a_document_outside_the_repository():
    for f in [*DOCS, *SOURCES]:
        text = f.read_text()
        assert "DESIGN.md" not in text and "shared/" not in text, f"{f.relative_to(ROOT)} points outside"


def _stated() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in SOURCES:
        for name in STATED.findall(f.read_text()):
            out.setdefault(name, set()).add(str(f.relative_to(ROOT)))
    return out


def _table() -> dict[str, str]:
    rows = {}
    for line in (ROOT / "docs" / "invariants.md").read_text().splitlines():
        m = re.match(r"\| `([A-Z]{2,}-\d+)` \|", line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} has two rows in docs/invariants.md"
            rows[m.group(1)] = line
    return rows


def test_invariants_md_lists_exactly_the_invariants_the_code_names():
    stated, listed = set(_stated()), set(_table())
    assert not stated - listed, f"named in the code but not in docs/invariants.md: {sorted(stated - listed)}"
    assert not listed - stated, (
        f"in docs/invariants.md but named nowhere in the code: {sorted(listed - stated)}"
    )


def test_the_tests_invariants_md_names_exist():
    defined = set()
    for f in [*(ROOT / "tests").rglob("*.py"), *(ROOT / "native").rglob("*.rs")]:
        defined.update(re.findall(r"(?:def|fn) (\w+)", f.read_text()))
    for name, row in _table().items():
        tests_cell = row.rsplit("|", 2)[-2]
        for t in re.findall(r"`(test_\w+|[a-z_]+_[a-z_]+)`", tests_cell):
            if t.endswith((".py", ".rs")) or "/" in t:
                continue
            assert t in defined, f"{name}: docs/invariants.md names {t}, which no test defines"
