"""What an executed notebook's cells say, as text (the notebook tests' one reader)."""

from __future__ import annotations

import nbformat


def cell_text(cell: nbformat.NotebookNode) -> str:
    """What a cell's outputs say, as text: streams, results and displays (their
    text/plain), and error tracebacks."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.append(out["data"].get("text/plain", ""))
        elif out["output_type"] == "error":
            parts.append("\n".join(out["traceback"]))
    return "\n".join(parts)
