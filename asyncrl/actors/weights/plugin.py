"""vLLM general plugin: registers the ``asyncrl`` weight-transfer engine in every vLLM process.

The one place asyncrl meets vLLM's weight-transfer factories. vLLM calls ``register()``
(entry point group ``vllm.general_plugins``, declared in pyproject.toml) in the API process,
the engine-core process and each worker process, so the worker-side factory knows
``"asyncrl"`` wherever the model lives. The engine then builds the receiver of whichever
transport the learner names (asyncrl/core/weights/), so a new transport needs no change here.
Registration is by module path (lazy) so loading the plugin imports nothing heavy, and it is
idempotent because vLLM may call it more than once per process.
"""

from __future__ import annotations

BACKEND = "asyncrl"
WORKER_ENGINE = ("asyncrl.actors.weights.receiver", "AsyncrlWeightTransferEngine")


def register() -> None:
    """Register ``BACKEND`` in vLLM's worker-side weight-transfer factory (the learner sends
    through its own ``ActorWeightChannel``, not vLLM's trainer-side API)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    # The factories raise on duplicate names; checking first makes repeated calls harmless.
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, *WORKER_ENGINE)
