"""The one schema of the Meshes panel's JSON (``extension/schema/mesh-view.schema.json``),
for the tests that read real views: a field the server sends that the schema (and so
the panel's ``IMesh``) does not name, or one it lacks, fails them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA = json.loads(
    (Path(__file__).parent.parent / "extension" / "schema" / "mesh-view.schema.json").read_text()
)
_validator = jsonschema.Draft202012Validator(SCHEMA)


def valid_view(view: Any) -> Any:
    """``view`` (a mesh's picture, ``controller.view_of``, or one of GET
    /monarch/meshes), after checking it against the schema; None passes through."""
    if view is not None:
        errors = sorted(_validator.iter_errors(view), key=lambda e: list(e.path))
        assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    return view
