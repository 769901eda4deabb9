"""``learner.keep_checkpoints=N``: the newest N complete checkpoints stay, older
ones go right after a new one is sealed; incomplete directories are never counted."""

from __future__ import annotations

from asyncrl.learner.state.checkpoint import latest_checkpoint, prune_checkpoints


def _ckpt(root, v: int, complete: bool = True):
    d = root / "checkpoints" / f"step_{v:06d}"
    d.mkdir(parents=True)
    (d / "weights").write_text("x")
    if complete:
        (d / "COMPLETE").write_text(str(v))
    return d


def test_only_the_newest_n_complete_checkpoints_stay(tmp_path):
    for v in (2, 4, 6, 8):
        _ckpt(tmp_path, v)
    broken = _ckpt(tmp_path, 10, complete=False)  # an interrupted save: not a checkpoint
    removed = prune_checkpoints(tmp_path, 2)
    assert [p.name for p in removed] == ["step_000002", "step_000004"]
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == ["step_000006", "step_000008", "step_000010"] and broken.exists()
    assert latest_checkpoint(tmp_path).name == "step_000008"


def test_zero_keeps_all_and_fewer_than_n_removes_nothing(tmp_path):
    for v in (1, 2, 3):
        _ckpt(tmp_path, v)
    assert prune_checkpoints(tmp_path, 0) == [] and prune_checkpoints(tmp_path, 5) == []
    assert len(list((tmp_path / "checkpoints").iterdir())) == 3


def _sealed(root, v: int):
    from asyncrl.learner.state.checkpoint import write_manifest

    d = _ckpt(root, v)
    (d / "dcp").mkdir()
    (d / "dcp" / "__0_0.distcp").write_bytes(bytes(range(256)) * 64)
    write_manifest(d)
    return d


def test_a_truncated_shard_is_named_and_resume_falls_back_to_the_one_before(tmp_path):
    """Formerly, a truncated shard met torch's bare "checkpoint file is corrupted", with no
    path and no fallback."""
    import pytest

    from asyncrl.core.runtime.fatal import FatalError
    from asyncrl.learner.state.checkpoint import latest_good_checkpoint, verify_checkpoint

    good, bad = _sealed(tmp_path, 2), _sealed(tmp_path, 4)
    assert verify_checkpoint(bad) is None
    shard = bad / "dcp" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    assert (
        verify_checkpoint(bad) == "dcp/__0_0.distcp has 1000 bytes, 16384 were written (truncated?)"
    )
    said: list[str] = []
    assert latest_good_checkpoint(tmp_path, said.append) == good
    assert "step_000004 is damaged: dcp/__0_0.distcp has 1000 bytes" in said[0]
    data = bytearray((good / "weights").read_bytes())
    (good / "weights").write_bytes(b"y" * len(data))  # same size, other bytes
    assert verify_checkpoint(good) == "weights does not match its checksum (damaged)"
    with pytest.raises(FatalError, match="every checkpoint under .* is damaged"):
        latest_good_checkpoint(tmp_path, said.append)


def test_a_prune_never_deletes_the_intact_checkpoint_a_damaged_newest_one_falls_back_to(
    tmp_path,
):
    """Issue 43 round 4: with keep_checkpoints=1 and a damaged newest checkpoint, the intact
    one before it was already pruned (by the COMPLETE marker alone), so the resume had no
    fallback. Now a prune keeps the newest verified checkpoint and all newer."""
    from asyncrl.learner.state.checkpoint import latest_good_checkpoint

    first, second = _sealed(tmp_path, 2), _sealed(tmp_path, 4)
    shard = second / "dcp" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])  # the newest is damaged
    said: list[str] = []
    assert prune_checkpoints(tmp_path, 1, said.append) == []
    assert first.exists() and "step_000004 is damaged" in said[0]
    assert latest_good_checkpoint(tmp_path, said.append) == first
    third = _sealed(tmp_path, 6)  # a later intact one: now the older ones may go
    assert prune_checkpoints(tmp_path, 1, said.append) == [first, second]
    assert latest_good_checkpoint(tmp_path, said.append) == third


def test_when_every_checkpoint_is_damaged_an_intact_export_is_offered(tmp_path):
    """Issue 43 round 4: the message did not offer the intact hf/ export."""
    import pytest

    from asyncrl.core.runtime.fatal import FatalError
    from asyncrl.learner.state.checkpoint import latest_good_checkpoint, write_manifest

    d = _ckpt(tmp_path, 2)
    (d / "hf").mkdir()
    (d / "hf" / "config.json").write_text("{}")
    (d / "dcp").mkdir()
    (d / "dcp" / "__0_0.distcp").write_bytes(b"x" * 100)
    write_manifest(d)
    (d / "dcp" / "__0_0.distcp").write_bytes(b"x" * 10)  # the training state is damaged
    with pytest.raises(FatalError) as e:
        latest_good_checkpoint(tmp_path, lambda _: None)
    assert f"its weights are intact in the export {d / 'hf'}" in str(e.value)
    assert f"model=local model.path={d / 'hf'}" in str(e.value)
