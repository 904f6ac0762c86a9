"""A/B of the call path against another commit: ``make bench AB=COMMIT``.

Builds COMMIT's wheel (``maturin build --release``; its Rust build is kept under
``target/ab``, so a second run only builds what changed) into a scratch venv under
``$TMPDIR/monarch-ab/COMMIT`` that takes every other package from this venv, then
runs the call rows (``call_one``, ``call()`` to 2 procs, pipelined ``call_one``)
and the port rows (``call_one`` of an endpoint that answers on its port, and port
messages an actor sends, per second) with this checkout and with COMMIT alternately, ``BENCH_AB_PAIRS`` pairs (default
3), each in a fresh process, and prints each pair and the medians. A change on the
hot path is shown by this, not by two runs at different times: this machine's call
latency varies more between minutes than between builds.

    python -m bench.ab COMMIT            (from the repository root)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAIRS = int(os.environ.get("BENCH_AB_PAIRS", "3"))


def _run(cmd: list[str], **kw: object) -> None:
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def scratch_python(commit: str) -> Path:
    """A venv with ``commit``'s build of the package (built once per commit)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{commit}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    home = Path(tempfile.gettempdir()) / "monarch-ab" / sha[:12]
    python = home / "venv" / "bin" / "python"
    if (home / "installed").exists():
        return python
    src = home / "src"
    if not src.exists():
        src.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", sha], cwd=ROOT, check=True, capture_output=True).stdout
        _run(["tar", "-x", "-C", str(src)], input=archive)
        # git archive dates each file at its commit: older than the build scripts that
        # another commit's build ran in the shared target dir, so cargo would take that
        # build's generated code (the protos) as up to date. Dated now, they are built.
        for f in src.rglob("*"):
            os.utime(f)
    wheels = home / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    env = {**os.environ, "CARGO_TARGET_DIR": str(ROOT / "target" / "ab")}
    maturin = Path(sys.executable).parent / "maturin"
    _run(
        [str(maturin), "build", "--release", "-q", "-o", str(wheels), "-i", sys.executable], cwd=src, env=env
    )
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(home / "venv")])
    # Every other package from this venv (its folder is read after the scratch venv's own).
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "from-main-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheels.glob("*.whl"))
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)])
    (home / "installed").touch()
    return python


def calls_with(python: Path, n: int) -> dict[str, float]:
    """The call rows (``bench/calls.py``) with ``python``'s build, run as a script from
    outside the checkout (so that its ``monarch_kernel`` folder is not the one imported)."""
    out = subprocess.run(
        [str(python), str(ROOT / "bench" / "calls.py"), str(n)],
        cwd=tempfile.gettempdir(),
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bench.ab COMMIT   (or: make bench AB=COMMIT)")
    commit = sys.argv[1]
    other = scratch_python(commit)
    n = int(os.environ.get("BENCH_CALLS", "2000"))
    rows: dict[str, dict[str, list[float]]] = {"this": {}, commit: {}}
    for i in range(PAIRS):
        for name, python in (("this", Path(sys.executable)), (commit, other)):
            got = calls_with(python, n)
            for k, v in got.items():
                rows[name].setdefault(k, []).append(v)
            print(
                f"pair {i + 1}, {name:>12}: " + ", ".join(f"{k} {v:,.0f}" for k, v in got.items()), flush=True
            )
    print(
        f"\nmedians of {PAIRS} alternating pairs (call_one, call and port_answer in us; pipelined "
        "in calls/s, port_burst in port messages/s):"
    )
    keys = ("call_one", "call", "pipelined", "port_answer", "port_burst")
    print(f"{'':<12} " + " ".join(f"{k:>11}" for k in keys))
    for name, got in rows.items():
        med = {k: statistics.median(v) for k, v in got.items()}
        print(f"{name:<12} " + " ".join(f"{med[k]:>11,.0f}" if k in med else f"{'n/a':>11}" for k in keys))


if __name__ == "__main__":
    main()
