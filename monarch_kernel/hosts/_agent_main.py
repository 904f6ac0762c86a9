"""Entry point of a host agent process (``python -m monarch_kernel.hosts._agent_main``).

Reads its configuration (``_allocator.AgentConfig``: token included, and across hosts
the mesh's TLS identity, TLS-3) as one JSON line on stdin, starts the native
agent, prints ``MONARCH_AGENT_READY <addr> <pid> <hostname> [<slurm job id>] id=<host id>``
(``_host_id.host_id()``: where its pid and address mean something), then runs until
the agent stops.

On another host (an allocator started it over ssh or srun), ``bind_host`` may be
``"auto"``: the agent listens on the address of this host that faces its controller
(``SSH_CONNECTION``, ``SLURM_LAUNCH_NODE_IPADDR`` or ``MONARCH_CONTROLLER_ADDR`` says
where the controller is), and, without ``log_dir``, logs to this host's state folder.
With ``--detach`` (ssh), it leaves the caller's session once it listens, so the ssh
command returns while the agent runs on (AGENT-1 still ends its workers with it).

With ``--config-env`` (a Kubernetes pod, ``_k8s``), the configuration is the
environment variable ``MONARCH_AGENT_CONFIG`` (from the mesh's Secret), removed from
the environment before anything else starts; ``MONARCH_BIND_HOST`` (the pod's
address) is where "auto" binds, and ``MONARCH_AGENT_PORT`` the port (the one its
readiness probe checks). With ``--standing`` too (a pool's pod, ``_k8s.pool_manifests``)
it waits for its first controller as long as it takes; once its mesh ends, so does
it, and its pod starts a new one for the next mesh.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
from collections.abc import Callable

from monarch_kernel.hosts._allocator import READY, AgentConfig

#: How long a standing agent (a pool's pod) waits for its first controller: a year.
STANDING_S = 365 * 24 * 3600.0


def main() -> None:
    if "--config-env" in sys.argv[1:]:
        line = os.environ.pop("MONARCH_AGENT_CONFIG", "")
        if not line:
            sys.exit(
                "monarch agent: MONARCH_AGENT_CONFIG is empty; a mesh's pod gets it from the mesh's Secret"
            )
        cfg = AgentConfig.from_line(line)
    else:
        cfg = AgentConfig.from_line(sys.stdin.readline())
    if cfg.state_home:  # the controller's, on a shared home
        os.environ["XDG_STATE_HOME"] = cfg.state_home
    detach = "--detach" in sys.argv[1:]
    if detach:
        _detach()
    bind_host = _bind_host(cfg.bind_host or "127.0.0.1")
    log_dir = cfg.log_dir or _own_log_dir(cfg.name)
    if detach or not cfg.log_dir:  # our stderr goes to the log from now on
        fd = os.open(os.path.join(log_dir, "agent.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
    from monarch_kernel import _native

    _native.set_runtime_threads(1)  # NODE-2: before anything starts the runtime
    tls = cfg.tls or {}
    agent = _native.start_agent(
        cfg.name,
        cfg.token,
        log_dir,
        float(cfg.idle_timeout),
        first_attach_timeout_s=STANDING_S if "--standing" in sys.argv[1:] else 30.0,
        meta=cfg.meta,
        bind_host=bind_host,
        tls_cert=tls.get("cert"),
        tls_key=tls.get("key"),
        tls_ca=tls.get("ca"),
        port=int(os.environ.pop("MONARCH_AGENT_PORT", "0") or 0),
    )
    del tls
    cfg = dataclasses.replace(cfg, tls=None)  # (the key stays in no more places than it must)
    if cfg.state_file and cfg.record:  # REGISTRY-2: listed from the first moment
        record = {**cfg.record, "agent_addr": agent.addr, "agent_pid": os.getpid()}
        try:
            _write(cfg.state_file, json.dumps(record, indent=1).encode())
        except OSError as e:  # the controller's own write tells the user
            print(
                f"monarch agent: cannot write the state file {cfg.state_file}: {e}",
                file=sys.stderr,
                flush=True,
            )
    from monarch_kernel.hosts._host_id import host_id

    job = os.environ.get("SLURM_JOB_ID", "")  # (srun started us: the job to end with the mesh)
    sys.stdout.write(f"{READY} {agent.addr} {os.getpid()} {socket.gethostname()} {job} id={host_id()}\n")
    sys.stdout.flush()
    # Nobody reads our stdout from now on: send it to the log like stderr.
    os.dup2(2, 1)
    stop = threading.Event()
    keeper = threading.Thread(
        target=_keep_state_file,
        args=(cfg.state_file, cfg.token, stop, lambda: agent.stopping),
        daemon=True,
    )
    keeper.start()
    agent.wait()
    stop.set()
    keeper.join(5.0)
    _forget(cfg.state_file, cfg.token)
    _native.shutdown_runtime()
    os._exit(0)


def _detach() -> None:
    """Forks: the parent passes on the child's ready line and exits (ending the ssh
    command); the child runs on in a session of its own, its stdin on /dev/null."""
    r, w = os.pipe()
    if os.fork():
        os.close(w)
        with os.fdopen(r, "rb") as ready:
            line = ready.readline()
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        os._exit(0 if line.startswith(READY.encode()) else 1)
    os.close(r)
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(w, 1)  # the ready line reaches the parent
    os.close(w)


def _bind_host(given: str) -> str:
    """``given``, or for "auto" the address of this host that faces the controller."""
    if given != "auto":
        return given
    if os.environ.get("MONARCH_BIND_HOST"):  # a pod's own address (Kubernetes' downward API)
        return os.environ["MONARCH_BIND_HOST"]
    peer = (
        os.environ.get("MONARCH_CONTROLLER_ADDR")
        or os.environ.get("SLURM_LAUNCH_NODE_IPADDR")
        or (os.environ.get("SSH_CONNECTION") or "").split(" ")[0]
    )
    if not peer:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))  # no packet is sent: this only picks the route's source address
        return str(s.getsockname()[0])


def _own_log_dir(name: str) -> str:
    """This host's log folder of mesh ``name`` (one per host: hosts may share a home,
    so an agent touches no other folder there; the controller prunes old ones)."""
    import shutil

    from monarch_kernel.hosts._local import private_dir, state_dir

    path = state_dir() / "logs" / f"{name}@{socket.gethostname()}"
    shutil.rmtree(path, ignore_errors=True)  # an earlier mesh of this name
    private_dir(state_dir() / "logs")
    return str(private_dir(path))


def _keep_state_file(
    state_file: str, token: str, stop: threading.Event, stopping: Callable[[], bool], every: float = 1.0
) -> None:
    """REGISTRY-2: the state file is the only way to find a running mesh, so while
    the agent runs it puts back a copy of its file if the file goes missing or is
    corrupt (a controller removes a corrupt file; a person may delete one), instead
    of running on unseen until its idle timeout. A file of another mesh of the same
    name (another token) is left alone."""
    if not state_file:
        return
    saved: bytes | None = None
    try:  # what this agent wrote at start, if it did
        with open(state_file, "rb") as f:
            first = f.read()
        if json.loads(first).get("token") == token:
            saved = first
    except (OSError, ValueError, AttributeError):
        pass
    while not stop.wait(every if saved is not None else 0.1):  # often until the first copy
        try:
            with open(state_file, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = None
        except OSError:
            continue
        if data is not None:
            try:
                rec = json.loads(data)
            except ValueError:
                rec = None  # corrupt
            if isinstance(rec, dict):
                if rec.get("token") == token:
                    saved = data
                continue  # ours (kept), or another mesh's: left alone
        if saved is None or stopping():
            continue  # the controller has not written it yet, or removes it as the mesh stops
        try:
            _write(state_file, saved)
            print(f"monarch agent: restored the state file {state_file}", file=sys.stderr, flush=True)
        except OSError:
            pass


def _write(state_file: str, data: bytes) -> None:
    """Writes the state file atomically, readable by its owner only."""
    tmp = f"{state_file}.{os.getpid()}.restore"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, state_file)


def _forget(state_file: str, token: str) -> None:
    """Removes the mesh's state file if it still describes this mesh (a mesh created
    again under the same name has a new file, with another token)."""
    if not state_file:
        return
    try:
        with open(state_file) as f:
            if json.load(f).get("token") == token:
                os.unlink(state_file)
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    main()
