"""Entry point of a worker process, started by its host agent.

The agent passes: the mesh token as the first line of stdin, and the mesh's TLS
identity as the second (JSON: ``{"ca", "cert", "key"}``; ``{}`` without TLS; TLS-3)
(AGENT-1: EOF on stdin later means the agent is gone, and the worker exits), a listening socket
(``MONARCH_LISTEN_FD``), its rank (``MONARCH_RANK``), the mesh's shape
(``MONARCH_SHAPE``), the controller's import path (``MONARCH_SYS_PATH``) and, for
``gpus`` meshes, the host's GPUs (``MONARCH_GPUS``, see ``hosts._placement``).

With ``MONARCH_TEMPLATE_FD`` set it is instead the agent's template process (FORK-1,
``native/src/agent/template.rs``): it imports what a worker imports, then forks
each worker the agent asks for; the child goes on as ``main()`` would after an
``exec``.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys

#: How long a worker's calls to a peer wait for it to be reachable again (RESUME-5).
PEER_RESUME_LIMIT_S = 120.0
#: In a worker forked from the template (FORK-1): how many modules it had when it was
#: forked (``sys.modules`` keeps the order of import: the ones after are its own).
MODULES_AT_FORK: int | None = None


def main() -> None:
    # A native crash (SIGSEGV, SIGABRT, SIGBUS...) writes the Python stack of the thread
    # that crashed to the real stderr, so the death report's last lines show where.
    faulthandler.enable(file=2, all_threads=False)  # fd 2: the pipe the agent reads
    token = sys.stdin.readline().strip()
    tls = json.loads(sys.stdin.readline() or "{}")
    from monarch_kernel import _native

    _native.set_runtime_threads(1)  # NODE-2: before anything starts the runtime
    _native.exit_when_stdin_closes()  # (after both lines: it reads stdin from now on)
    # A worker has no supervisor to abandon its calls to a peer gone for good: they
    # fail after this long without a connection (RESUME-5).
    _native.set_resume_limit(PEER_RESUME_LIMIT_S)
    if tls.get("ca"):  # TLS-2: this worker's own calls to the mesh's other workers
        _native.set_mesh_ca(token, tls["ca"])
    dims, sizes = json.loads(os.environ["MONARCH_SHAPE"])
    rank = int(os.environ["MONARCH_RANK"])
    from monarch_kernel.hosts import apply_in_worker

    apply_in_worker(rank, dims, sizes)  # before any user code can initialise CUDA
    from monarch_kernel.mesh import prefer_huge_pages

    prefer_huge_pages()
    from monarch_kernel.worker import _output

    _output.install()
    from monarch_kernel.worker import _debug

    _debug.install()
    for p in reversed(json.loads(os.environ.get("MONARCH_SYS_PATH", "[]"))):
        if p not in sys.path:
            sys.path.insert(0, p)
    from monarch_kernel.mesh import Extent, Point, ProcMesh, ProcRef, Shape, install_worker
    from monarch_kernel.worker import Dispatcher

    server = _native.WorkerServer(
        token,
        listen_fd=int(os.environ["MONARCH_LISTEN_FD"]),
        tls_cert=tls.get("cert"),
        tls_key=tls.get("key"),
    )
    del tls
    point = Point(rank, Extent(dims, sizes))
    mesh = os.environ.get("MONARCH_MESH", "mesh")
    this_proc = ProcMesh(ProcRef(f"{mesh}[{rank}]", token, (server.addr,)), Shape(Extent([], [])))
    dispatcher = Dispatcher(server, point, token)
    # OWN-1: this worker's unhandled failures go up to its controller.
    install_worker(token, this_proc, up=dispatcher.send_up)
    dispatcher.start()
    import signal
    import threading

    worker_pid = os.getpid()

    def on_term(_sig: int, _frame: object) -> None:  # STOP-1: actors clean up, then exit
        if os.getpid() != worker_pid:  # a forked child (a DataLoader worker): ends as usual
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        threading.Thread(target=dispatcher.exit_cleanly, name="monarch-exit", daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    # The main thread runs SPMD code (MAIN-1); the process lives until the agent stops
    # it or goes away (AGENT-1).
    from monarch_kernel.worker import _main_thread

    _main_thread.serve_forever()


def template() -> None:
    """FORK-1: serve the agent's requests to fork a worker, on the socket it passed
    (``MONARCH_TEMPLATE_FD``), until it closes; report each child's exit there."""
    import gc
    import selectors
    import signal
    import socket
    import threading

    _import_what_workers_use()

    # The IPython shell that %%mesh cells run in (about 200 modules and 16 MiB a
    # process): made once here, its pages shared by every child; made in each
    # worker, 1,024 workers ran out of this machine's 24 GiB at their first cell.
    # Only for a controller that runs cells (a notebook's kernel): a script's mesh
    # has no cells, and its hosts save the 0.1 s of CPU the shell takes.
    if os.environ.get("MONARCH_WORKER_SHELL") == "1":
        from monarch_kernel.worker import _display

        _display.ensure()
    if threading.active_count() != 1:  # a fork copies only the forking thread
        raise RuntimeError(f"the worker template started threads: {threading.enumerate()}")

    sock = socket.socket(fileno=int(os.environ.pop("MONARCH_TEMPLATE_FD")))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    gc.freeze()  # the children share these pages: the collector must not write them
    me = os.getpid()

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
            sock.send(json.dumps({"exit": pid, "code": code, "signal": signum}).encode())

    while True:
        for key, _ in sel.select():
            if key.fileobj is not sock:
                while os.read(wake_r, 512) == 512:
                    pass
                continue
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 4)
            if not msg:  # the agent is gone (its children die with this process)
                os._exit(0)
            pid = os.fork()
            if pid == 0:
                sel.close()
                for fd in (sock.detach(), wake_r, wake_w):
                    os.close(fd)
                _become_worker(json.loads(msg)["rank"], fds, me)
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"pid": pid}).encode())
        reap()


def _import_what_workers_use() -> None:
    """FORK-1: imports, in the template, every module that ``main()`` and an actor's
    spawn and first call import, so that each child shares them instead of importing
    them again (``monarch_kernel.mesh`` and ``hosts`` import their parts on first use:
    at 1,024 workers, importing those parts in each child was 1,024 times the
    unmarshalling and class-making the template does once)."""
    from monarch_kernel import _caller, _native, actor, worker  # noqa: F401
    from monarch_kernel.hosts import apply_in_worker  # noqa: F401
    from monarch_kernel.mesh import ActorMesh, ProcMesh, ProcRef, ValueMesh, call_builtin  # noqa: F401
    from monarch_kernel.worker import _debug, _display, _main_thread, _output, _spmd  # noqa: F401


def _become_worker(rank: int, fds: list[int], template_pid: int) -> None:
    """In a child of the template: take the worker's pipes and socket, then run as
    ``main()``; never returns."""
    import signal
    import traceback

    from monarch_kernel import _native

    global MODULES_AT_FORK
    MODULES_AT_FORK = len(sys.modules)
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        if not _native.die_with_parent(template_pid):
            os._exit(70)  # AGENT-1: the template (and so the agent) is gone already
        listen, stdin, stdout, stderr = fds
        for fd, to in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, to)
            os.close(fd)
        os.environ["MONARCH_RANK"] = str(rank)
        os.environ["MONARCH_LISTEN_FD"] = str(listen)
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        os._exit(code)


if __name__ == "__main__":
    if "MONARCH_TEMPLATE_FD" in os.environ:
        template()
    else:
        main()
