"""Benchmarks for kcoord: ``python -m bench.commit_bench`` and ``python -m bench.load_bench``."""
