"""A run that ends before its first step says why (with every group dropped for an
infinite reward, the message blamed ``learner.max_wall_s=0``, which means no limit)."""

from __future__ import annotations

from asyncrl.core.config.load import load_config
from asyncrl.learner import trainer
from asyncrl.learner.hub.hub import no_batch_text


class _Hub:
    def __init__(self, stopped=False, reason="every actor ran out of prompts: ..."):
        self.stopped, self.reason = stopped, reason

    def stop_requested(self):
        return self.stopped

    def no_batch_reason(self):
        return self.reason


def _why(monkeypatch, hub, elapsed, *overrides):
    monkeypatch.setattr(trainer, "_rank0_text", lambda text: text)
    return str(trainer._untrained(load_config(list(overrides)), hub, 0, elapsed))


def test_no_time_limit_names_where_the_groups_went_not_max_wall_s(monkeypatch):
    text = _why(monkeypatch, _Hub(), 30.0, "learner.max_wall_s=0")
    assert "every actor ran out of prompts" in text and "max_wall_s" not in text


def test_a_limit_that_ran_out_and_a_stop_request_are_named(monkeypatch):
    assert "learner.max_wall_s=5 ran out after 6.0 s" in _why(
        monkeypatch, _Hub(), 6.0, "learner.max_wall_s=5"
    )
    assert "no step was trained: every actor ran out" in _why(
        monkeypatch, _Hub(), 3.0, "learner.max_wall_s=5"
    )  # the limit was not reached
    assert "a stop request" in _why(monkeypatch, _Hub(stopped=True), 1.0)


def test_the_text_names_each_drop_reason_and_its_fix():
    text = no_batch_text(True, 12, {"invalid": 12, "stale": 0, "uniform": 0})
    assert text.startswith(
        "every actor ran out of prompts: 12 groups committed, dropped: 12 invalid"
    )
    assert "NaN, inf or not a number" in text and "task.reward_fn" in text and "stale" not in text
    assert "none dropped, too few for a batch" in no_batch_text(True, 3, {"stale": 0})
    assert no_batch_text(False, 0, {}).startswith("the learner stopped before a batch")


def test_a_full_disk_is_recognised_through_torchs_own_error(tmp_path, monkeypatch):
    """Torch's checkpoint writer said "unexpected pos 704 vs 598" on a full disk."""
    import errno

    from asyncrl.learner.state import checkpoint

    full = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise full
        except OSError as e:
            raise RuntimeError("unexpected pos 704 vs 598") from e
    except RuntimeError as wrapped:
        assert checkpoint.disk_full(wrapped, tmp_path)
    assert not checkpoint.disk_full(RuntimeError("unexpected pos 704 vs 598"), tmp_path)
    monkeypatch.setattr(checkpoint, "LOW_SPACE_BYTES", 1 << 62)  # as if almost nothing were free
    assert checkpoint.disk_full(RuntimeError("unexpected pos 704 vs 598"), tmp_path)


def test_a_full_disk_inside_dcps_checkpoint_exception_is_a_full_disk(tmp_path):
    """DCP reports a rank's failed write as a ``CheckpointException`` (a BaseException) holding
    ``(OSError, traceback)`` per rank; the chaos run's full disk arrived that way once the
    pickle guard let DCP's gathered exception through."""
    import errno

    from torch.distributed.checkpoint.api import CheckpointException

    from asyncrl.learner.state import checkpoint

    full = CheckpointException("write", {0: (OSError(errno.ENOSPC, "No space left"), [])})
    other = CheckpointException("write", {0: (OSError(errno.EACCES, "Permission denied"), [])})
    assert checkpoint.disk_full(full, tmp_path) and not checkpoint.disk_full(other, tmp_path)
