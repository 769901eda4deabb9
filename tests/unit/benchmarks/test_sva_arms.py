"""benchmarks/sync_vs_async/run.py's arms: one async arm per staleness bound,
``algorithm.stale_tokens`` option and ``buffer.admission``, the
default's names unchanged."""

from __future__ import annotations

from benchmarks.sync_vs_async.run import arm_overrides


def test_the_default_arms_keep_their_names():
    arms = arm_overrides([0, 1], [1, 4])
    assert list(arms) == ["sync_colocated", "sync_split", "async_s1", "async_s4"]
    assert not any("stale_tokens" in x for a in arms.values() for x in a)


def test_an_async_arm_per_bound_and_option():
    arms = arm_overrides([0, 1], [1, 4], stale_tokens=("drop_group", "mask", "interpolate"))
    asyncs = [a for a in arms if a.startswith("async")]
    assert asyncs == [
        "async_s1", "async_s1_mask", "async_s1_interpolate",
        "async_s4", "async_s4_mask", "async_s4_interpolate",
    ]  # fmt: skip
    assert "algorithm.stale_tokens=interpolate" in arms["async_s4_interpolate"]
    assert "buffer.max_staleness=4" in arms["async_s4_interpolate"]
    assert arms["async_s1_mask"][-3:] == arms["async_s1"][-3:]  # the same cores


def test_an_async_arm_per_bound_option_and_admission():
    arms = arm_overrides(
        [0, 1], [1], stale_tokens=("drop_group", "mask"), admission=("capacity", "window")
    )
    asyncs = [a for a in arms if a.startswith("async")]
    assert asyncs == ["async_s1", "async_s1_window", "async_s1_mask", "async_s1_mask_window"]
    assert "buffer.admission=window" in arms["async_s1_mask_window"]
    assert "algorithm.stale_tokens=mask" in arms["async_s1_mask_window"]
    assert "buffer.admission=capacity" in arms["async_s1_mask"]  # stated, whatever the preset
