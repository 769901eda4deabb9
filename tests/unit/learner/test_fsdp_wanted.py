"""``asyncrl.learner.compute.model.fsdp_wanted``: which learner models FSDP2 shards. One float32 rank trains
the plain module (FSDP2's hooks shard nothing there); two or more ranks, 16-bit compute over
float32 masters, and CPU offload keep FSDP2."""

from __future__ import annotations

import pytest

import asyncrl.learner.compute.model as lm


class _Dist:
    def __init__(self, world: int | None):
        self.world = world

    def is_initialized(self) -> bool:
        return self.world is not None

    def get_world_size(self) -> int:
        return self.world


@pytest.mark.parametrize(
    ("world", "dtype", "offload", "wanted"),
    [
        (None, "float32", False, False),  # no process group: plain (unit tests, tools)
        (1, "float32", False, False),  # one float32 rank: plain
        (1, "bfloat16", False, True),  # mixed precision needs FSDP2's policy
        (1, "float32", True, True),  # offload needs FSDP2
        (2, "float32", False, True),
        (8, "bfloat16", False, True),
    ],
)
def test_which_models_are_sharded(monkeypatch, world, dtype, offload, wanted):
    monkeypatch.setattr(lm, "dist", _Dist(world))
    assert lm.fsdp_wanted(dtype, offload) is wanted


def test_float16_is_refused_on_a_gpu_learner_and_allowed_elsewhere():
    """Issue 43 round 4: model.dtype=float16 trained on a GPU without a grad scaler."""
    import pytest
    import torch

    from asyncrl.core.runtime.fatal import FatalError
    from asyncrl.learner.compute.model import check_training_dtype

    with pytest.raises(
        FatalError, match=r"model.dtype=float16 on a GPU learner: .* use model.dtype=bfloat16"
    ):
        check_training_dtype("float16", torch.device("cuda", 0))
    check_training_dtype("bfloat16", torch.device("cuda", 0))
    check_training_dtype("float16", torch.device("cpu"))  # warned at launch instead
