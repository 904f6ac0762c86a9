"""The Jupyter protocol conformance suite (jupyter_kernel_test) against the monarch
kernel: execute, complete, inspect, is_complete, history, errors, display data."""

from __future__ import annotations

import os
import tempfile
import unittest

import jupyter_kernel_test as jkt

from monarch_kernel.kernel._install import install

_prefix = tempfile.mkdtemp(prefix="monarch-kernelspec-")


def setUpModule() -> None:  # noqa: N802 - unittest's name
    install(prefix=_prefix)
    os.environ["JUPYTER_PATH"] = os.path.join(_prefix, "share", "jupyter")


def tearDownModule() -> None:  # noqa: N802
    os.environ.pop("JUPYTER_PATH", None)


class MonarchKernelConformance(jkt.KernelTests):
    kernel_name = "monarch"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('monarch test error')"
    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data = [
        {
            "code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
            "mime": "text/html",
        },
        {
            "code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))",
            "mime": "text/latex",
        },
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"


if __name__ == "__main__":
    unittest.main()
