"""Asyncrl against TRL's GRPOTrainer (python -m benchmarks.vs_trl)."""
