"""The Jupyter server extension behind the meshes panel (issue 18): what
``monarch-kernel ls`` sees, as JSON over the server's own authenticated HTTP.

- ``GET /monarch/meshes``: every running mesh of this user, with its procs;
- ``GET /monarch/events``: the same, as server-sent events, each time it changes
  (the server looks at the agents every ``EVERY_S``, only while someone listens; the
  browser polls nothing);
- ``GET /monarch/meshes/NAME/logs?rank=R&tail=N``: a mesh's recent output;
- ``GET /monarch/meshes/NAME/stacks``: what each of its workers runs now;
- ``POST /monarch/meshes/NAME/respawn``: restarts a mesh's dead ranks, through the
  kernel of this server that holds it (``%mesh respawn NAME``), or as
  ``monarch-kernel respawn NAME`` when no controller holds it;
- ``POST /monarch/meshes/NAME/down``: stops a mesh, as ``monarch-kernel down NAME``.

The routes are registered by ``_handlers.handlers``; ``tests/unit/test_docs.py``
checks that this list and docs/panel.md name exactly those.

SERVER-1: a mesh name is checked as a name (``_registry.check_name``), never used as
a path, and only the meshes of the user who runs the server are seen (the state
files under that user's state home).
"""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "monarch_kernel.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from monarch_kernel.server._handlers import handlers

    base = serverapp.web_app.settings.get("base_url", "/")
    serverapp.web_app.add_handlers(".*$", handlers(base))
    serverapp.log.info("monarch_kernel: the meshes panel's API is at %smonarch/meshes", base)


__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]
