"""The config schema: one dataclass per Hydra group, validated in ``__post_init__``.

job        ``Config``, the root, with the buffer and mode groups (the schema's entry point)
load       composing ``configs/`` and the overrides into a validated ``Config``
actor, algorithm, learner, network, sampling, task   one module per group
checks     the checks every dataclass runs (each names the key and the fix)
cores      ``cpu_affinity: auto``: which cores each role gets (pure)
"""
