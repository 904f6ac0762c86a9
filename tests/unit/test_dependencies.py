"""What the package needs at run time is declared, so a fresh install has it."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _declared() -> set[str]:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}


def test_nvidia_ml_py_is_declared_for_gpu_metrics_and_placement():
    # The inspector's GPU columns and GPU placement import pynvml; undeclared, they
    # silently vanished on a fresh install.
    assert "nvidia-ml-py" in _declared()


def test_every_third_party_module_the_package_imports_is_declared():
    provided_by = {
        "anywidget": "anywidget",
        "cloudpickle": "cloudpickle",
        "grpc": "grpcio",
        "google": "protobuf",
        "ipykernel": "ipykernel",
        "IPython": "ipython",
        "jupyter_client": "jupyter-client",
        "psutil": "psutil",
        "pynvml": "nvidia-ml-py",
        "traitlets": "ipykernel",  # traitlets comes with ipykernel
        "matplotlib_inline": "ipykernel",  # (ipykernel's inline backend)
        "comm": "ipykernel",  # (ipykernel's comms)
        "jupyter_core": "jupyter-client",  # (jupyter_client's paths)
    }
    #: Imported only where the user's own code needs it (torch for tensors and
    #: torch.distributed, numpy for arrays, matplotlib for a worker's figures, once
    #: the user's code has imported it): optional by design.
    optional = {"torch", "numpy", "typing_extensions", "matplotlib"}
    #: The server extension (monarch_kernel.server) is loaded only by a Jupyter
    #: server, which brings these.
    optional |= {"tornado", "jupyter_server"}
    #: get_meter() gives OpenTelemetry's meter where the user installed it.
    optional |= {"opentelemetry"}
    #: KubernetesJob needs the Kubernetes client: the "k8s" extra.
    optional |= {"kubernetes"}
    declared = _declared()
    root = PYPROJECT.parent / "monarch_kernel"
    missing = set()
    for path in root.rglob("*.py"):
        if "/v1/" in str(path):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top == "monarch_kernel" or top in sys.stdlib_module_names or top in optional:
                    continue
                if provided_by.get(top) not in declared:
                    missing.add(f"{top} ({path.relative_to(root.parent)})")
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"
