"""The core layer, which every other part of asyncrl imports and which imports none of them
(docs/architecture.md, "The map"). Its rooms, lowest first:

    types.py   the shared records: ``Sample``, ``Group``
    config/    the schema (a dataclass per Hydra group), loading and checks
    runtime/   fatal errors, waits with deadlines, lifelines, the run directory
    observe/   Prometheus metrics, experiment trackers
    net/       the control plane, the metrics endpoints' registry, the no-pickle guard
    weights/   the weight stream's format and its transports (gloo, shm, nccl)
"""
