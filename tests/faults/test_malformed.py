"""Guarantee 6: malformed payloads are dead-lettered with a reason naming the defect.

Seeded generators build bad stream entries of every kind (random bytes,
truncated Arrow IPC, wrong schema version, offsets out of range, token ids outside the
vocabulary, length mismatches, oversized payloads, missing fields, ...). They are XADDed
straight into a real buffer stream on a real redis-server, mixed with valid groups committed
through ``ReplayBuffer.commit``, and read back through ``ReplayBuffer.read`` with the vocab
size. Every bad entry must be dead-lettered with a reason of its generator's category, every
valid group delivered intact, the reader must never raise, and conservation must hold.
"""

from __future__ import annotations

import os
import random
import re
import struct
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest

from asyncrl.buffer.codec import encode_group
from asyncrl.buffer.connection import connect
from asyncrl.buffer.redis_buffer import BufferOptions, ReplayBuffer
from asyncrl.buffer.testing import add_as_committed, random_group

pytestmark = [pytest.mark.faults, pytest.mark.redis]

VOCAB = 100
MAX_BYTES = 64 * 1024
SEED = int(os.environ.get("ASYNCRL_MALFORMED_SEED", "5"))
_TERMINAL = ("trained", "dropped_stale", "dropped_invalid", "dropped_poison", "dropped_uniform")

Case = tuple[dict[bytes, bytes], str]
"""(stream entry fields, regex the dead-letter reason must match)."""


# -- building blocks -------------------------------------------------------------------------


def _batch(rng: random.Random, gid: str, **kw) -> pa.RecordBatch:
    """A valid group's record batch (decoded from its real encoding)."""
    payload = encode_group(random_group(rng, gid, vocab_size=VOCAB, **kw))
    return pa.ipc.open_stream(payload).read_next_batch()


def _ipc(batch: pa.RecordBatch, batches: int = 1, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as w:
        for _ in range(batches):
            w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _fields(gid: str, payload: bytes) -> dict[bytes, bytes]:
    """Entry fields as ReplayBuffer.commit writes them (seq is filled in when added)."""
    return {b"group_id": gid.encode(), b"payload": payload}


def _with_meta(batch: pa.RecordBatch, **changes: str | None) -> pa.RecordBatch:
    meta = {k.decode(): v.decode() for k, v in batch.schema.metadata.items()}
    for k, v in changes.items():
        if v is None:
            meta.pop(f"asyncrl.{k}", None)
        else:
            meta[f"asyncrl.{k}"] = v
    return batch.replace_schema_metadata(meta)


def _replace(batch: pa.RecordBatch, name: str, array: pa.Array) -> pa.RecordBatch:
    """``batch`` with column ``name`` swapped for ``array`` (no validation)."""
    cols = [array if n == name else batch.column(n) for n in batch.schema.names]
    fields = [pa.field(n, c.type) for n, c in zip(batch.schema.names, cols, strict=True)]
    schema = pa.schema(fields, metadata=batch.schema.metadata)
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def _list_col(batch: pa.RecordBatch, name: str, rows: list[list], typ=None) -> pa.RecordBatch:
    return _replace(batch, name, pa.array(rows, type=typ or batch.schema.field(name).type))


# -- generators: (rng, gid) -> Case ------------------------------------------------------------


def gen_random_bytes(rng: random.Random, gid: str) -> Case:
    n = rng.choice([0, 1, 7, 8, 64, rng.randrange(2000)])
    data = bytes(rng.randrange(256) for _ in range(n))
    if rng.random() < 0.3:  # random bytes behind a valid IPC continuation marker
        data = b"\xff\xff\xff\xff" + struct.pack("<i", rng.randrange(1, 1 << 16)) + data
    return _fields(gid, data), r"Arrow IPC|record batch|Arrow validation|exactly 1 record batch"


def gen_truncated(rng: random.Random, gid: str) -> Case:
    payload = encode_group(random_group(rng, gid, vocab_size=VOCAB))
    cut = rng.randrange(len(payload) - 8)  # the last 8 bytes are the end-of-stream marker
    return _fields(gid, payload[:cut]), r"Arrow IPC|truncated|corrupt|exactly 1 record batch, got 0"


def gen_bit_flips_in_header(rng: random.Random, gid: str) -> Case:
    """Garbage in the IPC framing (the first message's length prefix and flatbuffer)."""
    payload = bytearray(encode_group(random_group(rng, gid, vocab_size=VOCAB)))
    payload[4:8] = struct.pack("<i", rng.choice([-5, 0x7FFFFFFF, len(payload) * 4]))
    return _fields(gid, bytes(payload)), r"Arrow IPC|truncated|corrupt|record batch"


def gen_schema_version(rng: random.Random, gid: str) -> Case:
    version = rng.choice(["0", "5", "", "1.0", "01", "999"])
    batch = _with_meta(_batch(rng, gid), schema_version=version)
    if rng.random() < 0.3:
        batch = _with_meta(batch, schema_version=None)
    return _fields(gid, _ipc(batch)), r"schema version"


def gen_offsets_out_of_range(rng: random.Random, gid: str) -> Case:
    """A list column's offsets buffer patched on the wire (Arrow refuses to build one)."""
    batch = _batch(rng, gid)
    name = rng.choice(["prompt_ids", "completion_ids", "behavior_logprobs", "token_versions"])
    col = batch.column(name)
    offsets = col.offsets.to_pylist()
    payload = _ipc(batch)
    body = len(payload) - 8 - _body_size(payload)  # the record batch body, before the EOS
    at = payload.find(struct.pack(f"<{len(offsets)}i", *offsets), body)
    assert at > 0, "offsets buffer not found in the IPC body"
    i = rng.randrange(1, len(offsets))
    bad = rng.choice([len(col.values) + rng.randint(1, 1000), -rng.randint(1, 50),
                      2**31 - 1, offsets[i - 1] - 1])  # fmt: skip
    patched = payload[: at + 4 * i] + struct.pack("<i", bad) + payload[at + 4 * i + 4 :]
    return _fields(gid, patched), r"Arrow validation: .*(Offset|offset|List child)"


def _body_size(payload: bytes) -> int:
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(payload))
    reader.read_next_message()  # schema
    return reader.read_next_message().body.size


def gen_token_outside_vocab(rng: random.Random, gid: str) -> Case:
    batch = _batch(rng, gid)
    name = rng.choice(["prompt_ids", "completion_ids"])
    rows = batch.column(name).to_pylist()
    bad = rng.choice([VOCAB, VOCAB + rng.randrange(10**6), 2**31 - 1, -1, -(2**31)])
    targets = range(len(rows)) if name == "prompt_ids" else [rng.randrange(len(rows))]
    j = rng.randrange(len(rows[0])) if name == "prompt_ids" else None
    for r in targets:  # the same prompt in every row, so only the vocab check can fail
        rows[r][j if j is not None else rng.randrange(len(rows[r]))] = bad
    reason = rf"{name}: (token id {bad} >= vocab_size {VOCAB}|negative token id {bad})"
    return _fields(gid, _ipc(_list_col(batch, name, rows))), reason


def gen_length_mismatch(rng: random.Random, gid: str) -> Case:
    batch = _batch(rng, gid)
    name = rng.choice(["behavior_logprobs", "token_versions", "completion_ids"])
    rows = batch.column(name).to_pylist()
    r = rng.randrange(len(rows))
    if rng.random() < 0.5 and len(rows[r]) > 1:
        rows[r] = rows[r][: rng.randrange(1, len(rows[r]))]
    else:
        rows[r] = rows[r] + rows[r][:1] * rng.randint(1, 5)
    if name == "completion_ids" and rng.random() < 0.5:
        rows[r] = []  # an empty completion is its own defect
        return _fields(gid, _ipc(_list_col(batch, name, rows))), r"empty completion|tokens but"
    return _fields(gid, _ipc(_list_col(batch, name, rows))), r"completion_ids has \d+ tokens but"


def gen_versions(rng: random.Random, gid: str) -> Case:
    batch = _batch(rng, gid)
    lo = int(batch.schema.metadata[b"asyncrl.version_min"])
    if rng.random() < 0.5:
        bad = _with_meta(batch, version_min=str(lo + rng.choice([-1, 1, 7])))
        return _fields(gid, _ipc(bad)), r"version_min/version_max .* disagree"
    rows = batch.column("token_versions").to_pylist()
    rows[rng.randrange(len(rows))][0] = -rng.randint(1, 9)
    bad = _list_col(batch, "token_versions", rows)
    return _fields(gid, _ipc(bad)), r"token_versions: negative version"


def gen_oversized(rng: random.Random, gid: str) -> Case:
    group = random_group(rng, gid, vocab_size=VOCAB, n=8, max_len=16)
    for s in group.samples:  # a valid group, just too big for max_payload_bytes
        k = MAX_BYTES // 8
        s.completion_ids[:] = [1] * k
        s.loss_mask = [1] * k
        s.behavior_logprobs[:] = [-0.5] * k
        s.token_versions[:] = [group.version_min] * k
    return _fields(gid, encode_group(group)), rf"over the {MAX_BYTES}-byte limit"


def gen_compression_bomb(rng: random.Random, gid: str) -> Case:
    """A compressed body: a few KB on the wire, ~``n`` x 12 bytes once expanded."""
    batch = _batch(rng, gid, n=1)
    n = rng.choice([10, 100_000, 1_000_000])
    offsets = pa.array(np.array([0, n], dtype=np.int32))
    version = int(batch.schema.metadata[b"asyncrl.version_min"])
    columns = {
        "completion_ids": np.zeros(n, dtype=np.int32),
        "behavior_logprobs": np.full(n, -0.5, dtype=np.float32),
        "token_versions": np.full(n, version, dtype=np.int32),
    }
    for name, values in columns.items():
        batch = _replace(batch, name, pa.ListArray.from_arrays(offsets, pa.array(values)))
    batch = _with_meta(batch, version_max=str(version))
    payload = _ipc(batch, compression=rng.choice(["zstd", "lz4"]))
    return _fields(gid, payload), r"compressed Arrow IPC record batch"


def gen_missing(rng: random.Random, gid: str) -> Case:
    batch = _batch(rng, gid)
    kind = rng.choice(["column", "group_id", "meta_int", "payload_field", "everything"])
    if kind == "column":
        drop = rng.choice(batch.schema.names)
        cols = [n for n in batch.schema.names if n != drop]
        bad = pa.RecordBatch.from_arrays(
            [batch.column(n) for n in cols],
            schema=pa.schema([batch.schema.field(n) for n in cols], batch.schema.metadata),
        )
        return _fields(gid, _ipc(bad)), rf"missing column\(s\) \['{drop}'\]"
    if kind == "group_id":
        return _fields(gid, _ipc(_with_meta(batch, group_id=None))), r"group_id is missing"
    if kind == "meta_int":
        key = rng.choice(["prompt_index", "actor_id", "version_min", "version_max"])
        value = rng.choice([None, "", "x", "1e3", "9" * 30])
        return _fields(gid, _ipc(_with_meta(batch, **{key: value}))), rf"asyncrl\.{key} is"
    if kind == "payload_field":
        return {b"group_id": gid.encode()}, r"no payload field"
    return {b"junk": b"1"}, r"no payload field"


def gen_bad_values(rng: random.Random, gid: str) -> Case:
    batch = _batch(rng, gid)
    kinds = ["nan_logprob", "pos_logprob", "nan_reward", "finish", "nulls", "type", "episode"]
    kind = rng.choice(kinds)
    if kind in ("nan_logprob", "pos_logprob"):
        rows = batch.column("behavior_logprobs").to_pylist()
        rows[0][0] = float("nan") if kind == "nan_logprob" else 0.5
        bad, reason = _list_col(batch, "behavior_logprobs", rows), r"behavior_logprobs: "
    elif kind == "nan_reward":
        vals = batch.column("reward").to_pylist()
        vals[-1] = rng.choice([float("nan"), float("inf")])
        bad, reason = _replace(batch, "reward", pa.array(vals, pa.float32())), r"reward: NaN"
    elif kind == "finish":
        vals = batch.column("finish_reason").to_pylist()
        vals[0] = rng.choice([-1, 3, 127])
        bad, reason = _replace(batch, "finish_reason", pa.array(vals, pa.int8())), "finish_reason"
    elif kind == "nulls":
        rows = batch.column("completion_ids").to_pylist()
        rows[0] = None if rng.random() < 0.5 else [None] + rows[0][1:]
        bad, reason = _list_col(batch, "completion_ids", rows), r"contains nulls"
    elif kind == "episode":
        bad, reason = _bad_episode(rng, batch)
    else:
        rows = batch.column("prompt_ids").to_pylist()
        bad = _list_col(batch, "prompt_ids", rows, pa.list_(pa.int64()))
        reason = r"schema mismatch"
    return _fields(gid, _ipc(bad)), reason


def _bad_episode(rng: random.Random, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, str]:
    """One episode column of one row out of its range (codec schema version 3)."""
    r = rng.randrange(batch.num_rows)
    name = rng.choice(["loss_mask", "turns", "tool_errors", "episode_end"])
    values = batch.column(name).to_pylist()
    if name == "loss_mask":
        values[r] = [rng.choice([0, 2, -1])] + values[r][1:]
        return _list_col(batch, name, values), rf"row {r}: Sample\.loss_mask"
    if name == "tool_errors":
        values[r] = batch.column("tool_calls")[r].as_py() + rng.randint(1, 9)
        return _replace(batch, name, pa.array(values, pa.int32())), rf"row {r}: Sample\.tool_errors"
    if name == "turns":
        values[r] = rng.choice([0, -3])
        return _replace(batch, name, pa.array(values, pa.int16())), rf"row {r}: Sample\.turns"
    values[r] = rng.choice([-1, 6, 127])
    return _replace(batch, name, pa.array(values, pa.int8())), r"episode_end code out of range"


def gen_framing(rng: random.Random, gid: str) -> Case:
    """Entry-level defects: two batches, no seq marker... around a valid-looking payload."""
    batch = _batch(rng, gid)
    kind = rng.choice(["two_batches", "zero_batches", "gid_mismatch", "bad_utf8", "dictionary"])
    if kind == "two_batches":
        return _fields(gid, _ipc(batch, batches=2)), r"exactly 1 record batch, got 2"
    if kind == "zero_batches":
        return _fields(gid, _ipc(batch, batches=0)), r"exactly 1 record batch, got 0"
    if kind == "dictionary":
        col = batch.column("reward_error").dictionary_encode()
        return _fields(gid, _ipc(_replace(batch, "reward_error", col))), r"IPC message"
    if kind == "gid_mismatch":
        return _fields(gid + "-other", _ipc(batch)), r"entry group_id .* != payload|no seq field"
    payload = _ipc(_with_meta(batch, group_id=gid))
    raw = payload.replace(gid.encode(), b"\xff" * len(gid), 1)
    return _fields(gid, raw), r"utf-8|UTF8|Arrow IPC|corrupt|group_id .* != payload"


GENERATORS: dict[str, Callable[[random.Random, str], Case]] = {
    g.__name__[4:]: g
    for g in (gen_random_bytes, gen_truncated, gen_bit_flips_in_header, gen_schema_version,
              gen_offsets_out_of_range, gen_token_outside_vocab, gen_length_mismatch,
              gen_versions, gen_oversized, gen_compression_bomb, gen_missing, gen_bad_values,
              gen_framing)
}  # fmt: skip


# -- the test ------------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_malformed_payloads_are_dead_lettered_with_a_reason(redis_server, counts):
    n_bad = counts(360, 1200)
    rng = random.Random(SEED)
    name = f"malformed-{os.getpid()}-{time.monotonic_ns()}"
    buf = ReplayBuffer(
        connect(redis_server.url), name, 10_000, BufferOptions(max_payload_bytes=MAX_BYTES)
    )
    expected: dict[str, tuple[str, str]] = {}  # entry id -> (generator, reason regex)
    valid: dict[str, object] = {}  # group id -> Group
    delivered: dict[str, object] = {}
    kinds = list(GENERATORS)
    t0 = time.monotonic()
    for i in range(n_bad):
        kind = kinds[i % len(kinds)]
        fields, reason = GENERATORS[kind](rng, f"bad-{i}")
        if rng.random() < 0.8 and b"payload" in fields:  # looks committed: counted like one
            entry_id = add_as_committed(buf.client, name, fields)
        else:
            entry_id = buf.client.xadd(name, fields).decode()
        expected[entry_id] = (kind, reason)
        if rng.random() < 0.25:  # a valid group through the real commit path
            group = random_group(rng, f"ok-{i}", vocab_size=VOCAB)
            assert buf.commit(buf.lease(0, 1.0), group)
            valid[group.group_id] = group
        if i % 50 == 49 or i == n_bad - 1:
            _drain(buf, delivered, i)
    elapsed = time.monotonic() - t0

    where = f"(seed {SEED}: rerun with ASYNCRL_MALFORMED_SEED={SEED})"
    dead = dict(buf.dead_letters(count=10 * n_bad))
    missed = [(eid, expected[eid][0]) for eid in expected if eid not in dead]
    assert not missed, f"{len(missed)} bad entries not dead-lettered {where}: {missed[:5]}"
    wrong = [(expected[e][0], expected[e][1], r) for e, r in dead.items()
             if e in expected and not re.search(expected[e][1], r)]  # fmt: skip
    assert not wrong, f"dead-letter reason of the wrong category {where}: {wrong[:5]}"
    assert set(dead) == set(expected), f"a valid group was dead-lettered {where}"
    assert delivered == valid, f"valid groups not delivered intact {where}"
    s = buf.stats()
    assert s["committed"] == sum(s[k] for k in _TERMINAL) + s["unread"] + s["pending"], s
    assert (s["dropped_invalid"], s["trained"], s["unread"], s["pending"]) == (
        n_bad, len(valid), 0, 0,
    ), s  # fmt: skip
    per_kind = {k: sum(1 for v in expected.values() if v[0] == k) for k in kinds}
    print(f"\nmalformed: {n_bad} bad + {len(valid)} valid entries, seed {SEED}, "
          f"{elapsed:.1f}s, per generator {per_kind}")  # fmt: skip


def _drain(buf: ReplayBuffer, delivered: dict, i: int) -> None:
    """Read everything unread (as the learner would) and ack it as trained."""
    for _ in range(1000):  # bounded: each round consumes at least one entry
        try:
            entries = buf.read("learner", count=16, block_ms=0, vocab_size=VOCAB)
        except Exception as e:  # the reader must never raise on bad input
            raise AssertionError(f"ReplayBuffer.read raised near case {i} (seed {SEED})") from e
        if not entries:
            return
        for e in entries:
            assert e.group.group_id not in delivered, f"{e.group.group_id} delivered twice"
            delivered[e.group.group_id] = e.group
        buf.ack([e.entry_id for e in entries], "trained")
    raise AssertionError("drain did not finish in 1000 reads")
