"""The worker's side of workspace sync (``ProcMesh.sync_workspace``, ``%mesh sync``;
the controller's side is ``controller/_workspace``).

A host's copy of the workspace is a folder of its own, ``$WORKSPACE_DIR`` where the
host sets it (Monarch's variable), else ``STATE/workspace/MESH@HOSTNAME`` (hosts
that share a home keep separate copies). One proc per host answers ``plan`` (which
files it lacks or has in another version, by content hash, against the manifest it
kept from the last sync) and ``apply`` (reads the changed files from the controller
through the transfer engine, writes each atomically, removes those the workspace no
longer has, keeps the manifest); then every proc ``use``s it: its folders first on
``sys.path``, the import caches invalidated, and, on request, the modules it had
imported from files that changed reloaded."""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

MANIFEST = ".monarch-workspace.json"
#: Which folders of the copy the mesh's procs import from, and the mesh's token: a
#: respawned proc of that mesh (only) imports from them again.
USED = ".monarch-workspace-use.json"


def base(mesh: str) -> Path:
    """This host's copy of mesh ``mesh``'s workspace (see the module docstring)."""
    given = os.environ.get("WORKSPACE_DIR")
    if given:
        return Path(given)
    from monarch_kernel.hosts import state_dir

    return state_dir() / "workspace" / f"{mesh}@{socket.gethostname()}"


def _kept(root: Path) -> dict[str, str]:
    try:
        kept = json.loads((root / MANIFEST).read_text())
        return dict(kept) if isinstance(kept, dict) else {}
    except (OSError, ValueError):
        return {}


def plan(mesh: str, manifest: dict[str, str]) -> list[str]:
    """The files of ``manifest`` (path: content hash) this host lacks or has in
    another version."""
    root = base(mesh)
    kept = _kept(root)
    return sorted(p for p, h in manifest.items() if kept.get(p) != h or not (root / p).is_file())


def apply(mesh: str, manifest: dict[str, str], buffer: Any, index: list[tuple[str, int, int, int]]) -> int:
    """Writes the files ``index`` names (path, offset and size in ``buffer``, mode),
    read from the controller's ``buffer`` (a TransferBuffer); removes the files of
    the last sync that ``manifest`` no longer has; keeps ``manifest``. The number of
    files removed."""
    root = base(mesh)
    root.mkdir(parents=True, exist_ok=True)
    if index:
        data = bytearray(buffer.nbytes)
        buffer.read_into(data).get()
        view = memoryview(data)
        for rel, offset, size, mode in index:
            dst = _inside(root, rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.{os.getpid()}.sync")
            with open(tmp, "wb") as f:
                f.write(view[offset : offset + size])
            os.chmod(tmp, mode & 0o777)
            os.replace(tmp, dst)
            _forget_bytecode(dst)
    removed = 0
    for rel in set(_kept(root)) - set(manifest):
        try:
            gone = _inside(root, rel)
            gone.unlink()
            _forget_bytecode(gone)
            removed += 1
        except OSError:
            pass
    tmp = root / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, root / MANIFEST)
    return removed


def _forget_bytecode(path: Path) -> None:
    """Removes the cached bytecode of a module file just written: Python checks a
    ``.pyc`` by the source's size and modification second, which an edit of the same
    size within the same second does not change (the reload would run the old code)."""
    if path.suffix != ".py":
        return
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        try:
            pyc.unlink()
        except OSError:
            pass


def _inside(root: Path, rel: str) -> Path:
    """``root / rel``, refused if ``rel`` would leave ``root``."""
    path = (root / rel).resolve()
    if root.resolve() not in path.parents:
        raise ValueError(f"workspace path {rel!r} leaves the workspace")
    return path


def use(mesh: str, folders: list[str] | None, changed: list[str], reload: bool, token: str) -> list[str]:
    """This proc imports from the workspace's ``folders`` (relative to the copy,
    "" for its root) before anything else, sees files that are new, and with
    ``reload`` reloads the modules it had imported from the ``changed`` files; their
    names. ``folders`` None (a respawned proc): those the last sync of this mesh
    (``token``) on this host named, if there was one."""
    root = base(mesh)
    if folders is None:
        try:
            used = json.loads((root / USED).read_text())
        except (OSError, ValueError):
            return []
        if not isinstance(used, dict) or used.get("token") != token:
            return []  # (a copy an earlier mesh of this name left)
        folders = [str(f) for f in used.get("folders", [])]
    else:
        tmp = root / f".{USED}.{os.getpid()}"
        tmp.write_text(json.dumps({"folders": folders, "token": token}))
        os.replace(tmp, root / USED)
    os.environ.setdefault("WORKSPACE_DIR", str(root))
    for folder in reversed(folders):
        path = str(root / folder) if folder else str(root)
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    importlib.invalidate_caches()
    if not reload or not changed:
        return []
    files = {str((root / rel).resolve()) for rel in changed if rel.endswith(".py")}
    reloaded = []
    for name, module in sorted(sys.modules.items()):
        source = getattr(module, "__file__", None)
        if source and os.path.realpath(source) in files:
            importlib.reload(module)
            reloaded.append(name)
    return reloaded


__all__ = ["MANIFEST", "apply", "base", "plan", "use"]
