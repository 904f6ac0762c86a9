"""Workspace sync, the controller's side: ``ProcMesh.sync_workspace`` /
``HostMesh.sync_workspace`` / ``%mesh sync`` send the notebook's working directory
(and named extra folders) to every host of a mesh, only what changed, once per host,
through the transfer engine; the workers import from the host's copy and, on
request (``auto_reload``), reload the modules whose files changed. The worker's
side is ``worker/_workspace``.

What is sent: each folder's files, by content (SHA-256, remembered here by size and
modification time so an unchanged file is not read again), except version-control
and cache folders, virtual environments, hidden folders and files over
``MAX_FILE_BYTES`` (named in the result's ``skipped``). Each host's first live proc
compares the manifest with what it has and asks for the rest; one buffer holds the
changed files of every host."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monarch_kernel.errors import MeshSpecError

#: Folders never sent (with every folder whose name starts with '.', and every
#: virtual environment: a folder with a ``pyvenv.cfg``).
SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "venv", "env", "build", "dist", "wandb"})
#: Files larger than this are not sent (datasets, checkpoints); the result names them.
MAX_FILE_BYTES = 64 << 20
#: A workspace larger than this in all is refused (a data folder given by mistake).
MAX_TOTAL_BYTES = 2 << 30

#: Content hashes by (path, size, mtime_ns): a file that did not change is not read again.
_hashes: dict[tuple[str, int, int], str] = {}


class Workspace:
    """Monarch's ``monarch.tools.config.Workspace``: folders of this host and where
    each goes in the hosts' workspace (``dirs=[path, ...]``: each under its own name;
    ``dirs={path: "dest"}``; ``""``: the workspace's root). ``env`` is accepted and
    not used (the image, or the hosts' Python, is the environment)."""

    def __init__(self, dirs: Any = None, env: Any = None) -> None:
        self.env = env
        self.dirs: dict[Path, str] = {}
        if isinstance(dirs, dict):
            self.dirs = {Path(k): str(v) for k, v in dirs.items()}
        elif dirs is not None:
            self.dirs = {Path(d): Path(d).name for d in dirs}

    def __repr__(self) -> str:
        return f"Workspace(dirs={ {str(k): v for k, v in self.dirs.items()} })"


@dataclass
class SyncResult:
    """What a sync did: files sent (with their bytes) to how many hosts, files
    removed there, modules reloaded (name: ranks), files not sent (too large)."""

    files: int = 0
    nbytes: int = 0
    hosts: int = 0
    removed: int = 0
    unchanged: int = 0
    reloaded: dict[str, list[int]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        from monarch_kernel._ranks import rank_runs

        parts = [
            f"synced {self.files} changed file{'s' if self.files != 1 else ''} ({_size(self.nbytes)}) "
            f"to {self.hosts} host{'s' if self.hosts != 1 else ''}; {self.unchanged} unchanged"
        ]
        if self.removed:
            parts.append(f"{self.removed} removed")
        if self.reloaded:
            parts.append(
                "reloaded "
                + ", ".join(f"{m} (ranks {', '.join(rank_runs(r))})" for m, r in self.reloaded.items())
            )
        if self.skipped:
            parts.append(f"not sent (over {_size(MAX_FILE_BYTES)}): {', '.join(self.skipped)}")
        return "; ".join(parts)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def folders_of(workspace: Any) -> dict[Path, str]:
    """The folders a ``sync_workspace(workspace)`` sends, and where each goes: None
    is this process's working directory, at the workspace's root; a path or a list
    of paths, each under its own name; a ``Workspace`` (or its ``dirs``) as given."""
    if workspace is None or workspace is False:
        dirs = {Path.cwd(): ""}
    elif isinstance(workspace, (str, os.PathLike)):
        dirs = {Path(workspace): Path(workspace).resolve().name}
    elif isinstance(workspace, dict):
        dirs = {Path(k): str(v) for k, v in workspace.items()}
    elif isinstance(workspace, (list, tuple)):
        dirs = {Path(p): Path(p).resolve().name for p in workspace}
    elif hasattr(workspace, "dirs"):
        dirs = folders_of(dict(workspace.dirs))
    else:
        raise MeshSpecError(
            f"sync_workspace({workspace!r}): give a folder, a list of folders, a {{folder: destination}} dict "
            "or a Workspace (None: the working directory)"
        )
    for src, dst in dirs.items():
        if not src.is_dir():
            raise MeshSpecError(f"sync_workspace: {src} is not a folder here")
        if Path(dst).is_absolute() or ".." in Path(dst).parts:
            raise MeshSpecError(
                f"sync_workspace: destination {dst!r} must be a relative path inside the workspace"
            )
    return {src.resolve(): dst for src, dst in dirs.items()}


def scan(dirs: dict[Path, str]) -> tuple[dict[str, tuple[Path, str, int]], list[str]]:
    """Every file to send: its path in the workspace -> (its path here, content hash,
    mode); and the files too large to send."""
    files: dict[str, tuple[Path, str, int]] = {}
    skipped: list[str] = []
    total = 0
    for src, dst in dirs.items():
        for top, subdirs, names in os.walk(src):
            subdirs[:] = sorted(
                d
                for d in subdirs
                if not d.startswith(".")
                and d not in SKIPPED_DIRS
                and not os.path.exists(os.path.join(top, d, "pyvenv.cfg"))
            )
            for name in sorted(names):
                path = Path(top) / name
                try:
                    st = path.stat()
                except OSError:
                    continue  # gone meanwhile, or a broken link
                if not path.is_file():
                    continue
                if st.st_size > MAX_FILE_BYTES:
                    skipped.append(str(path))
                    continue
                rel = (Path(dst) / path.relative_to(src)).as_posix()
                total += st.st_size
                if total > MAX_TOTAL_BYTES:
                    raise MeshSpecError(
                        f"sync_workspace: {', '.join(map(str, dirs))} hold more than {_size(MAX_TOTAL_BYTES)} "
                        "of files; sync the folders of your code only (sync_workspace(['src', 'configs'])), "
                        "and give data to the hosts another way"
                    )
                files[rel] = (path, _hash(path, st), st.st_mode)
    return files, skipped


def _hash(path: Path, st: os.stat_result) -> str:
    key = (str(path), st.st_size, st.st_mtime_ns)
    known = _hashes.get(key)
    if known is None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        known = _hashes[key] = h.hexdigest()
    return known


def pack(
    files: dict[str, tuple[Path, str, int]], wanted: set[str]
) -> tuple[bytearray, list[tuple[str, int, int, int]]]:
    """The ``wanted`` files' contents in one buffer, and where each is in it."""
    blob = bytearray()
    index = []
    for rel in sorted(wanted):
        path, _, mode = files[rel]
        data = path.read_bytes()
        index.append((rel, len(blob), len(data), mode))
        blob += data
    return blob, index


__all__ = ["MAX_FILE_BYTES", "SyncResult", "Workspace", "folders_of", "pack", "scan"]
