"""Synchronous against asynchronous training on multi-turn episodes whose environment is slow
and long-tailed (python -m benchmarks.multi_turn)."""
