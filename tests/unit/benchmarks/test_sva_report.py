"""The sync-vs-async report's verdicts are honest: 'faster' needs every seed pairing to be
faster, a slower arm is called NOT faster, overlapping spreads are called out, and a speedup
above the ideal overlap bound is flagged as noise."""

from benchmarks.sync_vs_async.report import _aggregate, _overlap, _verdicts

BASE = {"learner_idle_frac": 0.1, "actor_idle_frac": 0.2, "weight_sync_pause_learner_s": 1.0,
        "weight_sync_pause_actor_s": 1.0, "dropped_stale": 0, "staleness_histogram": {}}  # fmt: skip


def _arm(steps, ttt=None, G=0.4, T=0.6):
    figs = [{**BASE, "step_s_median": s, "time_to_target_s": (ttt or [None] * len(steps))[i],
             "G_s": G, "T_s": T} for i, s in enumerate(steps)]  # fmt: skip
    return {"per_seed": figs, "failed_seeds": [], **_aggregate(figs)}


def _verdict_lines(arms: dict, learned=True) -> list[str]:
    return _verdicts(arms, _overlap(arms), learned)


def test_faster_in_every_seed_pairing_is_called_faster():
    arms = {"sync_split": _arm([1.0, 1.1], [50, 60]), "sync_colocated": _arm([1.2, 1.3]),
            "async_s1": _arm([0.7, 0.75], [30, 35])}  # fmt: skip
    lines = _verdict_lines(arms)
    assert any(x.startswith("async_s1 is faster than sync_split in steps/s") for x in lines), lines
    assert any("faster than sync_split in time to the target reward" in x for x in lines), lines
    assert any("ideal overlap bound 1.67x" in x for x in lines), lines


def test_slower_is_called_not_faster():
    arms = {"sync_split": _arm([1.0, 1.0]), "async_s2": _arm([1.3, 1.4])}
    lines = _verdict_lines(arms)
    assert any(x.startswith("async_s2 is NOT faster than sync_split") for x in lines), lines


def test_overlapping_seeds_are_not_called_faster():
    # mean ratio 1.2x, but one pairing has async slower than sync
    arms = {"sync_split": _arm([0.8, 1.6]), "async_s1": _arm([0.9, 1.1])}
    lines = _verdict_lines(arms)
    line = next(x for x in lines if x.startswith("async_s1 is") and "steps/s" in x)
    assert "not in every seed pairing" in line and "seed pairings 0.73x-1.78x" in line, line


def test_a_speedup_above_the_overlap_bound_is_flagged():
    arms = {"sync_split": _arm([1.0], G=0.2, T=0.8), "async_s4": _arm([0.5], T=0.45)}
    lines = _verdict_lines(arms)  # bound (0.2 + 0.8) / 0.8 = 1.25x, achieved 2x
    assert any("beats the overlap bound" in x and "treat the excess as noise" in x for x in lines)


def test_no_learning_means_no_time_to_target_verdict():
    arms = {"sync_split": _arm([1.0], [40]), "async_s1": _arm([0.6], [20])}
    lines = _verdict_lines(arms, learned=False)
    assert lines[0].startswith("Reward did not rise beyond noise")
    assert not any("time to the target" in x for x in lines), lines
