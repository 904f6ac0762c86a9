"""The project's own documents stay true to the code: every link inside the
repository resolves, nothing points at a document outside it,
docs/invariants.md lists exactly the invariants the code states, each with tests
that exist, and the lists a document keeps of things in the tree match the tree:
the long files of docs/architecture.md, the variables of docs/environment.md, the
folders of the README's layout and the routes of the server extension."""

from __future__ import annotations

import re
import subprocess
from functools import cache
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


# -- lists of the tree's contents --------------------------------------------------------


@cache
def _git_files() -> tuple[str, ...] | None:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return tuple(f for f in out.decode().split("\0") if f and (ROOT / f).is_file())


def _tracked() -> tuple[str, ...]:
    """The tracked files (``git ls-files``) that are in the work tree."""
    files = _git_files()
    if files is None:
        pytest.skip("not a git checkout: which files are tracked is not known")
    return files


def _section(doc: Path, heading: str) -> str:
    """The text of ``doc``'s section whose heading matches ``heading``, up to the next
    heading of its level or above."""
    text = doc.read_text()
    m = re.search(rf"^(#+) {heading}$", text, re.M)
    assert m, f"{doc.relative_to(ROOT)} has no section headed like {heading!r}"
    end = re.search(rf"^#{{1,{len(m.group(1))}}} ", text[m.end() :], re.M)
    return text[m.end() : m.end() + end.start()] if end else text[m.end() :]


#: The long-file list (docs/architecture.md, "Files over 500 lines") counts
#: hand-written code, wherever it is (package, native/, extension/, tests/, bench/,
#: demo/): these suffixes, less the generated grpc stubs. Lock files, notebooks, JSON
#: and the documents themselves are not code and are not counted.
CODE = (".py", ".pyi", ".rs", ".ts", ".tsx", ".js", ".css", ".proto")
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")
LONG = 500


def _lines(f: str) -> int:
    return (ROOT / f).read_bytes().count(b"\n")  # as wc -l counts


def test_the_long_file_list_names_every_long_file_and_no_other():
    """docs/architecture.md's "Files over 500 lines" has a row for each tracked file of
    hand-written code (``CODE``, less ``GENERATED``) longer than 500 lines, as wc -l
    counts them in the work tree, and for no other file."""
    long = {
        f: n for f in _tracked() if f.endswith(CODE) and not GENERATED.search(f) and (n := _lines(f)) > LONG
    }
    listed = set()
    for line in _section(ROOT / "docs" / "architecture.md", rf"\d+\. Files over {LONG} lines").splitlines():
        m = re.match(r"\| \[`([^`]+)`\]\(\.\./([^)]+)\) \|", line)
        if m:
            assert m.group(1) == m.group(2), f"a long-file row shows {m.group(1)} but links {m.group(2)}"
            listed.add(m.group(2))
    add = sorted(set(long) - listed)
    remove = sorted(listed - set(long))
    wrong = []
    if add:
        wrong.append(
            "add a row (why it stays one file) for " + ", ".join(f"{f} ({long[f]} lines)" for f in add)
        )
    if remove:
        wrong.append(
            "remove the row of "
            + ", ".join(f"{f} ({_lines(f)} lines)" if (ROOT / f).is_file() else f"{f} (gone)" for f in remove)
        )
    assert not wrong, f"docs/architecture.md, 'Files over {LONG} lines': " + "; ".join(wrong)


ENVIRONMENT = ROOT / "docs" / "environment.md"
PACKAGE_CODE = [
    *SOURCES,
    *sorted((ROOT / "monarch_kernel").rglob("*.pyi")),
    *sorted(p for p in (ROOT / "extension" / "src").rglob("*.ts*") if "node_modules" not in p.parts),
]
TEST_CODE = [
    *sorted((ROOT / "tests").rglob("*.py")),
    *sorted((ROOT / "bench").rglob("*.py")),
    *sorted((ROOT / "demo").rglob("*.py")),
    *sorted((ROOT / "notebooks").glob("*.ipynb")),
    *sorted((ROOT / "tools").rglob("*.py")),
    *sorted((ROOT / "tools").rglob("*.sh")),
]
#: A ``MONARCH_*`` name written as a string ("MONARCH_ROOT", 'MONARCH_RANK', or
#: \"...\" inside a notebook's JSON): how the code names an environment variable.
#: Python names that merely start so (a test's list ``MONARCH_ACTOR = [...]``) are not
#: strings, so they are not taken.
MONARCH_STRING = re.compile(r"""["'](MONARCH_[A-Z0-9_]+)\\?["']""")
#: A variable the package reads or sets by its literal name: os.environ.get("X"),
#: os.environ["X"], os.environ.setdefault/pop("X"), os.getenv("X"), "X" in os.environ;
#: std::env::var("X"), Command::env("X", ...), env_remove("X").
NAMED_ACCESS = re.compile(
    r"""(?:os\.environ(?:\.get|\.setdefault|\.pop)?\(\s*|os\.environ\[\s*|os\.getenv\(\s*"""
    r"""|env::var(?:_os)?\(\s*|\.env\(\s*|env_remove\(\s*)["']([A-Z_][A-Z0-9_]*)["']"""
    r"""|["']([A-Z_][A-Z0-9_]*)["']\s+(?:not\s+)?in\s+os\.environ"""
)


def _strings(files: list[Path]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in files:
        for name in MONARCH_STRING.findall(f.read_text(errors="replace")):
            out.setdefault(name, set()).add(str(f.relative_to(ROOT)))
    return out


def _rows(heading: str) -> set[str]:
    """The variable names of the table under ``heading`` in environment.md (a row
    may name several: `RANK`, `WORLD_SIZE`)."""
    names = set()
    for line in _section(ENVIRONMENT, heading).splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z_][A-Z0-9_]*)`", line.split("|")[1]))
    return names


def _not_variables() -> set[str]:
    """The names environment.md's note says are no environment variables."""
    m = re.search(r"^Not an environment variable.*?(?:\n\n|\Z)", ENVIRONMENT.read_text(), re.M | re.S)
    assert m, "docs/environment.md has no note on names that are not environment variables"
    return set(re.findall(r"`(MONARCH_[A-Z0-9_]+)", m.group(0)))


def _where(found: dict[str, set[str]], names: set[str]) -> str:
    return ", ".join(f"{n} (in {', '.join(sorted(found[n]))})" for n in sorted(names))


def test_environment_md_lists_every_monarch_variable_the_code_names():
    """Every ``MONARCH_*`` string in the package (Python, Rust, the panel's TypeScript)
    has a row in docs/environment.md's package table, and every one in the tests,
    bench/, demo/ or notebooks/ a row in either table. A ``MONARCH_*`` name that is no
    environment variable is excluded by the document, not here: constants are not
    strings (``MONARCH_STRING``), and a string that is no variable (the agent's
    ``MONARCH_AGENT_READY`` line) is named in the document's "Not an environment
    variable" note."""
    package, tests = _rows("Read or set by the package"), _rows("Read only by tests and tools")
    not_variables = _not_variables()
    named = _strings(PACKAGE_CODE)
    lacking = set(named) - package - not_variables
    assert not lacking, "docs/environment.md, 'Read or set by the package', lacks a row for " + _where(
        named, lacking
    )
    named_by_tests = _strings(TEST_CODE)
    lacking = set(named_by_tests) - package - tests - not_variables
    assert not lacking, "docs/environment.md, 'Read only by tests and tools', lacks a row for " + _where(
        named_by_tests, lacking
    )


def test_every_monarch_name_environment_md_lists_is_still_named_by_the_code():
    def named_in(files: list[Path]) -> set[str]:
        return {n for f in files for n in re.findall(r"MONARCH_[A-Z0-9_]+", f.read_text(errors="replace"))}

    in_package, in_tests = named_in(PACKAGE_CODE), named_in(TEST_CODE)
    package = {n for n in _rows("Read or set by the package") if n.startswith("MONARCH_")}
    tests = {n for n in _rows("Read only by tests and tools") if n.startswith("MONARCH_")}
    stale = sorted((package | _not_variables()) - in_package) + sorted(tests - in_tests)
    assert not stale, f"docs/environment.md names {stale}, which no code names any more: remove them"


def test_environment_md_lists_every_variable_the_package_reads_or_sets_by_name():
    """Any variable, ``MONARCH_*`` or not (``SSH_CONNECTION``, ``XDG_STATE_HOME``), that
    the package reads or sets by its literal name (``NAMED_ACCESS``) has a row. One
    reached through a constant (``os.environ.get(GPUS_ENV)``) is not seen here; the
    ``MONARCH_*`` ones are, by their constant's string."""
    found: dict[str, set[str]] = {}
    for f in PACKAGE_CODE:
        for m in NAMED_ACCESS.finditer(f.read_text()):
            found.setdefault(m.group(1) or m.group(2), set()).add(str(f.relative_to(ROOT)))
    lacking = set(found) - _rows("Read or set by the package")
    assert not lacking, "docs/environment.md, 'Read or set by the package', lacks a row for " + _where(
        found, lacking
    )


def _layout() -> dict[str, str]:
    """The README's layout table: path -> what."""
    rows = {}
    for line in _section(ROOT / "README.md", "Layout").splitlines():
        m = re.match(r"\| `([^`]+)` \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


#: Rows of the README's layout that list what their folder holds, one level down.
LISTED_INSIDE = ("monarch_kernel", "tests")


def test_the_readme_layout_names_every_top_level_folder_and_what_the_package_and_tests_hold():
    rows, tracked = _layout(), _tracked()
    missing = sorted({f.split("/")[0] for f in tracked if "/" in f} - {p.split("/")[0] for p in rows})
    assert not missing, f"README.md, 'Layout', lacks a row for the folders {missing}"
    gone = sorted(p for p in rows if not (ROOT / p).exists())
    assert not gone, f"README.md, 'Layout', has rows for {gone}, which do not exist"
    for folder in LISTED_INSIDE:
        inside = {f.split("/")[1] for f in tracked if f.startswith(f"{folder}/") and f.count("/") >= 2}
        lacking = sorted(d for d in inside if f"`{d}/`" not in rows[f"{folder}/"])
        assert not lacking, (
            f"README.md, 'Layout': the {folder}/ row does not name {[d + '/' for d in lacking]}"
        )
    docs = {f for f in tracked if re.fullmatch(r"docs/[^/]+\.md", f)}
    unlinked = sorted(d for d in docs if f"]({d})" not in rows["docs/"])
    assert not unlinked, f"README.md, 'Layout': the docs/ row does not link {unlinked}"


#: A route as the server extension's docstring and docs/panel.md write it:
#: ``GET /monarch/meshes/NAME/logs?rank=R`` (the query aside).
ROUTE = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) (/monarch[^`?\s]*)")


def _served() -> set[str]:
    pytest.importorskip("jupyter_server")
    from jupyter_server.base.handlers import APIHandler

    from monarch_kernel.server._handlers import handlers

    routes = set()
    for pattern, cls in handlers("/"):
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: m.group(1).upper(), pattern)
        for method in ("get", "post", "put", "patch", "delete"):
            if getattr(cls, method) is not getattr(APIHandler, method):  # (tornado's: a 405)
                routes.add(f"{method.upper()} {path}")
    return routes


def test_the_server_extension_docstring_and_panel_md_name_exactly_the_routes_it_serves():
    """Each (method, path) that ``_handlers.handlers`` registers (a method a handler
    class defines itself) is listed in ``monarch_kernel.server``'s docstring and in
    docs/panel.md's table, and neither lists another."""
    import monarch_kernel.server

    served = _served()
    documented = {
        "monarch_kernel/server/__init__.py": {
            " ".join(m) for m in ROUTE.findall(monarch_kernel.server.__doc__ or "")
        },
        "docs/panel.md": {
            " ".join(m.groups())
            for line in (ROOT / "docs" / "panel.md").read_text().splitlines()
            if line.startswith("| `") and (m := ROUTE.search(line))
        },
    }
    for where, routes in documented.items():
        assert not served - routes, f"{where} does not name the routes {sorted(served - routes)}"
        assert not routes - served, (
            f"{where} names routes the server does not serve: {sorted(routes - served)}"
        )
