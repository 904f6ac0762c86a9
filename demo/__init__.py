"""The demos of `make demo` and `make demo-multihost`, run from the repository's root
(`python -m demo.run_notebook NOTEBOOK`, `python -m demo.run_multihost`)."""
