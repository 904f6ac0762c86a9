"""Executes a notebook with nbclient through the monarch kernel and prints it as a
reader would see it: each cell's source, then its outputs as text.

    python demo/run_notebook.py notebooks/quickstart.ipynb [--save OUT.ipynb]
"""

from __future__ import annotations

import argparse
import re
import sys
import time

import nbformat
from nbclient import NotebookClient

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _text(output: dict) -> str:
    kind = output["output_type"]
    if kind == "stream":
        return output["text"]
    if kind in ("execute_result", "display_data"):
        data = output.get("data", {})
        if "<progress" in data.get("text/html", "") or data.get("text/html") == "":
            return ""  # a progress bar (or its removal): not part of what a reader keeps
        text = data.get("text/plain")
        if text is None:
            text = f"[{', '.join(sorted(data))}]"
        prefix = f"Out[{output.get('execution_count')}]: " if kind == "execute_result" else ""
        return prefix + text + "\n"
    if kind == "error":
        return _ANSI.sub("", "\n".join(output["traceback"])) + "\n"
    return ""


def execute(path: str, kernel_name: str = "monarch", timeout: int = 300) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name=kernel_name, timeout=timeout, allow_errors=False).execute()
    return nb


def show(nb: nbformat.NotebookNode) -> None:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            print("\n" + "\n".join(f"  {line}" for line in cell.source.splitlines()))
            continue
        print(f"\nIn [{cell.execution_count}]:")
        print("\n".join(f"    {line}" for line in cell.source.splitlines()))
        for out in cell.outputs:
            sys.stdout.write("".join(f"  | {line}\n" for line in _text(out).rstrip("\n").splitlines()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook")
    ap.add_argument("--save", help="also write the executed notebook here")
    args = ap.parse_args()
    t = time.perf_counter()
    nb = execute(args.notebook)
    show(nb)
    print(f"\n{args.notebook}: executed through the monarch kernel in {time.perf_counter() - t:.1f} s")
    if args.save:
        nbformat.write(nb, args.save)


if __name__ == "__main__":
    main()
