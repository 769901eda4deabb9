"""benchmarks/learner/throughput_report.py: a learner arm's fair bare reference shares its compute
dtype, gradient checkpointing, threads and cores; ``bare`` when none does."""

from __future__ import annotations

from benchmarks.learner.throughput_report import _vs_ref


def _learner(ckpt: str) -> dict:
    return {"kind": "learner", "real_tokens_per_s_per_round": [30.0],
            "overrides": ["model.dtype=bfloat16", f"model.gradient_checkpointing={ckpt}"]}  # fmt: skip


def _bare(ckpt: bool, dtype: str = "bfloat16", rate: float = 20.0) -> dict:
    return {"kind": "bare", "real_tokens_per_s_per_round": [rate],
            "settings": {"dtype": dtype, "checkpointing": ckpt}}  # fmt: skip


def test_the_reference_shares_checkpointing():
    arms = {"bare": _bare(True), "bare_no_ckpt": _bare(False, rate=25.0),
            "asyncrl": _learner("true"), "no_ckpt": _learner("false")}  # fmt: skip
    assert _vs_ref("asyncrl", arms)["ref"] == "bare"
    got = _vs_ref("no_ckpt", arms)
    assert got["ref"] == "bare_no_ckpt" and got["median"] == 30.0 / 25.0
    assert got["same_dtype_threads_cores"]


def test_without_a_matching_bare_arm_bare_is_the_reference_and_says_so():
    arms = {"bare": _bare(True, dtype="float32"), "asyncrl": _learner("true")}
    got = _vs_ref("asyncrl", arms)
    assert got["ref"] == "bare" and not got["same_dtype_threads_cores"]
    assert _vs_ref("bare", arms) is None
