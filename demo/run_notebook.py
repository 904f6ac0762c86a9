"""Executes a notebook with nbclient through the monarch kernel and prints it as a
reader would see it: each cell's source, then its outputs as text.

A cell may answer the prompts it raises (a remote ``breakpoint()`` asks through the
kernel's stdin, which plain nbclient refuses): its metadata ``monarch.stdin`` lists the
lines to type, in order, for example ``["p x", "n", "c"]``. Each answer is echoed into
the cell's output after its prompt, as a reader would have seen it typed.

    python demo/run_notebook.py notebooks/quickstart.ipynb [--save OUT.ipynb]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from typing import Any

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


class StdinClient(NotebookClient):
    """nbclient that answers a cell's input requests from its ``monarch.stdin`` metadata."""

    async def async_execute_cell(self, cell: Any, cell_index: int, *args: Any, **kwargs: Any) -> Any:
        answers = list(cell.get("metadata", {}).get("monarch", {}).get("stdin", []))
        if not answers or self.kc is None:
            return await super().async_execute_cell(cell, cell_index, *args, **kwargs)
        kc = self.kc
        kc.allow_stdin = True

        async def answer() -> None:
            while True:
                msg = await kc.get_stdin_msg()
                if msg["msg_type"] != "input_request":
                    continue
                line = answers.pop(0) if answers else "c"  # out of answers: let it run on
                cell.outputs.append(
                    nbformat.v4.new_output(
                        "stream", name="stdout", text=msg["content"]["prompt"] + line + "\n"
                    )
                )
                kc.input(line)

        task = asyncio.ensure_future(answer())
        try:
            return await super().async_execute_cell(cell, cell_index, *args, **kwargs)
        finally:
            task.cancel()
            kc.allow_stdin = False


def execute(path: str, kernel_name: str = "monarch", timeout: int = 300, cwd: str | None = None) -> Any:
    nb = nbformat.read(path, as_version=4)
    StdinClient(nb, kernel_name=kernel_name, timeout=timeout, allow_errors=False).execute(cwd=cwd)
    return nb


def show(nb: nbformat.NotebookNode) -> None:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            print("\n" + "\n".join(f"  {line}" for line in cell.source.splitlines()))
            continue
        print(f"\nIn [{cell.execution_count}]:")
        print("\n".join(f"    {line}" for line in cell.source.splitlines()))
        for text in _joined(cell.outputs):
            sys.stdout.write("".join(f"  | {line}\n" for line in text.rstrip("\n").splitlines()))


def _joined(outputs: list[Any]) -> list[str]:
    """Each output's text, consecutive stream outputs of one stream as one text, as
    front ends show them: a line written in several pieces (``print(a, b)``) may
    arrive as several messages."""
    texts: list[str] = []
    stream = None
    for out in outputs:
        name = out.get("name") if out["output_type"] == "stream" else None
        if name is not None and name == stream:
            texts[-1] += _text(out)
        else:
            texts.append(_text(out))
        stream = name
    return texts


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
