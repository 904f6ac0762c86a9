"""A controller process on the test cluster's login host, driven from a test.

The controller must run inside the cluster (its addresses exist only there), so a
test starts ``python -c REPL`` in the login namespace and sends it Python code, one
request a line: ``ctl.run("procs = ...")`` executes, ``ctl.eval("expr")`` returns
the expression's value (as JSON); an exception in the controller is raised here as
``ControllerError`` with its type and message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from tools.testcluster import Cluster

REPL = r"""
import json, sys, traceback
scope = {}
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["eval"]:
            out = {"value": eval(req["code"], scope)}
        else:
            exec(req["code"], scope)
            out = {"value": None}
        text = json.dumps(out, default=repr)
    except BaseException as e:
        text = json.dumps({"error": type(e).__name__, "message": str(e), "trace": traceback.format_exc()})
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
"""


def private_mount(script: str) -> list[str]:
    """A command prefix that runs the rest of the command line in a mount namespace
    of its own (nothing it mounts is seen by any other process), after ``sh -c
    script`` (``$0``: the first word after the prefix; ``exec "$@"`` runs the rest)."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


class ControllerError(Exception):
    def __init__(self, kind: str, message: str, trace: str) -> None:
        super().__init__(f"{kind}: {message}\n{trace}")
        self.kind, self.message = kind, message


class Controller:
    """A Python process on the login host (see the module docstring)."""

    def __init__(
        self,
        cluster: Cluster,
        state_home: str,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        """``prefix``: a command that runs the controller in the login host (e.g.
        ``unshare`` for a private mount)."""
        env = {
            **os.environ,
            **cluster.env(),
            "XDG_STATE_HOME": state_home,
            "MONARCH_FORWARD_OUTPUT": "0",
            **(env or {}),
        }
        env.pop("MONARCH_TRANSFER_HOST", None)
        self.proc = subprocess.Popen(
            cluster.login_cmd([*prefix, sys.executable, "-u", "-c", REPL]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def _ask(self, code: str, is_eval: bool) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"code": code, "eval": is_eval}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise ControllerError("Exited", f"the controller exited with status {self.proc.wait(10)}", "")
        out = json.loads(line)
        if "error" in out:
            raise ControllerError(out["error"], out["message"], out["trace"])
        return out["value"]

    def run(self, code: str) -> None:
        self._ask(code, False)

    def eval(self, code: str) -> Any:
        return self._ask(code, True)

    def close(self) -> None:
        """Ends the controller (its meshes stop or are let go as at any exit)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
