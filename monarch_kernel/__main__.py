"""``python -m monarch_kernel``: the ``monarch-kernel`` command."""

import sys

from monarch_kernel.cli import main

sys.exit(main())
