"""Asyncrl's parts against the bare libraries: engine start, actor and learner overheads, buffer, weights, reward pool."""
