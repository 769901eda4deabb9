"""Synchronous against asynchronous training (python -m benchmarks.sync_vs_async)."""
