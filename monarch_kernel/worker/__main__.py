"""Entry point of a worker process, started by its host agent.

The agent passes: the mesh token as the first line of stdin, and the mesh's TLS
identity as the second (JSON: ``{"ca", "cert", "key"}``; ``{}`` without TLS; TLS-3)
(AGENT-1: EOF on stdin later means the agent is gone, and the worker exits), a listening socket
(``MONARCH_LISTEN_FD``), its rank (``MONARCH_RANK``), the mesh's shape
(``MONARCH_SHAPE``), the controller's import path (``MONARCH_SYS_PATH``) and, for
``gpus`` meshes, the host's GPUs (``MONARCH_GPUS``, see ``hosts._placement``).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys

#: How long a worker's calls to a peer wait for it to be reachable again (RESUME-5).
PEER_RESUME_LIMIT_S = 120.0


def main() -> None:
    # A native crash (SIGSEGV, SIGABRT, SIGBUS...) writes the Python stack of the thread
    # that crashed to the real stderr, so the death report's last lines show where.
    faulthandler.enable(file=2, all_threads=False)  # fd 2: the pipe the agent reads
    token = sys.stdin.readline().strip()
    tls = json.loads(sys.stdin.readline() or "{}")
    from monarch_kernel import _native

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


if __name__ == "__main__":
    main()
