"""Benchmarks: each prints ratios against a baseline measured in the same run and writes its section of
docs/benchmarks.md (report). Run from the checkout: python -m bench.<name> --help."""
