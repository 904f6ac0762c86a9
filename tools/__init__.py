"""Tools that the tests, the demos and the benchmarks use, importable from the
repository's root (``python -m tools.testcluster``); not part of the wheel."""
