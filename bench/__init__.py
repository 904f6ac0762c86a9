"""The benchmarks of `make bench` (`python -m bench.run` from the repository's root)."""
