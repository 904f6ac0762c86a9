"""This process's part in the meshes (``mesh._role.here``) and its exit in one explicit
order (``_shutdown``): the objects that replace the hook slots and the atexit handlers
whose order was their modules' import order."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from monarch_kernel._shutdown import Shutdown, Stage


def test_exit_runs_the_stages_in_their_order_whatever_order_they_were_added_in():
    done: list[str] = []
    s = Shutdown()
    s.at(Stage.RUNTIME, lambda: done.append("runtime"))
    s.at(Stage.LANES, lambda: done.append("lanes"))
    output = lambda: done.append("output")  # noqa: E731
    s.at(Stage.OUTPUT, output)
    s.at(Stage.OUTPUT, output)  # (once, however often it is added)

    def fails() -> None:
        raise RuntimeError("a step that fails")

    s.at(Stage.MESHES, fails)
    s.at(Stage.MESHES, lambda: done.append("meshes"))
    s.run()
    s.run()  # (once)
    assert done == ["meshes", "output", "lanes", "runtime"]


def test_a_bare_process_has_no_controller_and_importing_the_controller_installs_it():
    code = textwrap.dedent(
        """
        from monarch_kernel.mesh._role import here
        from monarch_kernel.mesh import _control
        assert here.controller is None and here.actors is None and here.server is None
        assert _control.session_for(None) is None and not _control.has_dispatcher()
        import monarch_kernel.controller
        assert here.controller is not None and here.actors is None
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_package_registers_no_atexit_handler_but_the_shutdowns():
    """Every exit step goes through ``_shutdown`` (its order is explicit there)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "monarch_kernel"
    users = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "atexit" in p.read_text() and p.name != "_shutdown.py"
    )
    assert users == [], (
        f"atexit used outside _shutdown.py: {users}; add a step with shutdown.at(Stage..., fn)"
    )
