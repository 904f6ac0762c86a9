"""Commands on a job's hosts, as Monarch's ``monarch.job`` has them: ``exec_command``
runs a command (or a Python script) on every host of a host mesh, or on one, and
gives its highest exit code."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any

from monarch_kernel.actor import Actor, endpoint
from monarch_kernel.errors import MeshSpecError
from monarch_kernel.mesh import Future


def _copy_lines(source: IO[bytes], sink: IO[str]) -> None:
    """Copies a child's output, line by line as it comes, to this worker's stream (which
    the controller shows under the rank that wrote it)."""
    for line in iter(source.readline, b""):
        sink.write(line.decode(errors="replace"))
        sink.flush()


class CommandRunner(Actor):
    """Runs one command on its proc (``exec_command``)."""

    @endpoint
    def run(
        self,
        argv: list[str],
        env: dict[str, str] | None,
        workdir: str | None,
        client_cwd: str,
        output_dir: str | None,
    ) -> int:
        """Runs ``argv`` with ``env`` added to this proc's environment, in ``workdir``
        (else the controller's working folder where this host has it); its output goes
        to ``output_dir``/stdout.txt and stderr.txt, or to this proc's output as it
        comes. Its exit code."""
        if argv[0].endswith(".py") or argv[0] == "-m":
            argv = [sys.executable, *argv]  # this proc's own Python
        cwd = workdir or (client_cwd if os.path.isdir(client_cwd) else None)
        full_env = {**os.environ, **(env or {})}
        if output_dir is not None:
            os.makedirs(output_dir, exist_ok=True)
            with (
                open(os.path.join(output_dir, "stdout.txt"), "wb") as out,
                open(os.path.join(output_dir, "stderr.txt"), "wb") as err,
            ):
                return subprocess.run(argv, cwd=cwd, env=full_env, stdout=out, stderr=err).returncode
        child = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert child.stdout is not None and child.stderr is not None
        copiers = [
            threading.Thread(target=_copy_lines, args=(child.stdout, sys.stdout), daemon=True),
            threading.Thread(target=_copy_lines, args=(child.stderr, sys.stderr), daemon=True),
        ]
        for t in copiers:
            t.start()
        try:
            code = child.wait()
        except BaseException:  # an interrupt of the call ends the command too
            child.kill()
            child.wait()
            raise
        for t in copiers:
            t.join()
        return code


def _argv(cmd: Sequence[str]) -> list[str]:
    """``cmd``, checked: a non-empty list of strings (a ``.py`` script or ``-m module``
    first runs with the procs' own Python)."""
    if isinstance(cmd, str) or not cmd or not all(isinstance(c, str) for c in cmd):
        raise MeshSpecError(f"exec_command: cmd must be a non-empty list of strings, not {cmd!r}")
    return list(cmd)


def exec_command(
    host_mesh: Any,
    cmd: list[str],
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    output_dir: str | None = None,
    rank: int | None = None,
    point: dict[str, int] | None = None,
    per_host: dict[str, int] | None = None,
) -> Future[int]:
    """Runs ``cmd`` on the hosts of ``host_mesh`` (one proc per host, or ``per_host``),
    or on the host at ``rank`` or ``point`` only, and gives the highest exit code (0:
    every one succeeded) as a ``Future``. The command starts at once, on procs of its
    own that are stopped when it ends; the Future only observes it. Its output shows
    under each rank as it comes (or, with ``output_dir``, goes to files there on each
    host)."""
    if rank is not None and point is not None:
        raise MeshSpecError("exec_command: give rank or point, not both")
    argv = _argv(cmd)
    hosts = host_mesh
    if point is not None:
        hosts = host_mesh.slice(**point)
    elif rank is not None:
        hosts = host_mesh.slice(hosts=rank) if "hosts" in host_mesh.sizes else host_mesh
        if "hosts" not in host_mesh.sizes and rank != 0:
            raise MeshSpecError(f"exec_command: rank={rank}, but this host mesh is one host (rank 0)")
    procs = hosts.spawn_procs(per_host=dict(per_host or {"procs": 1}))
    done: concurrent.futures.Future[int] = concurrent.futures.Future()
    client_cwd = os.getcwd()

    def run() -> None:
        # Every outcome settles the Future, once the procs have stopped.
        try:
            try:
                runners = procs.spawn("exec_command", CommandRunner)
                code = max(runners.run.call(argv, env, workdir, client_cwd, output_dir).get().values())
            finally:
                procs.stop()
        except BaseException as e:
            done.set_exception(e)
        else:
            done.set_result(code)

    threading.Thread(target=run, name="monarch-exec-command", daemon=False).start()
    return Future(_local=done)


__all__ = ["CommandRunner", "exec_command"]
