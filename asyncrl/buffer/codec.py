"""Arrow IPC codec for one ``Group`` = one record batch = one Redis stream entry.

Wire format (Arrow IPC *stream* format, exactly one record batch, one row per sample)::

    column             type             per row
    prompt_ids         list<int32>      [P] prompt token ids (P >= 1, same in every row)
    completion_ids     list<int32>      [C] token ids after the prompt (C >= 1)
    behavior_logprobs  list<float32>    [C] log pi_behave, finite and <= 0
    token_versions     list<int32>      [C] policy version that sampled each token, >= 0
    reward             float32          finite scalar reward
    finish_reason      int8             index into ``asyncrl.core.types.FINISH_REASONS``
    reward_error       string           "" when the reward function succeeded
    reward_extras      map<string,      the reward dict's other numeric values by key
                           float64>     (``Sample.reward_extras``): finite, distinct keys,
                                        at most ``MAX_REWARD_EXTRAS``; {} for none
    loss_mask          list<int8>       [C] 1 = model token, 0 = template/environment
                                        token; values in {0, 1}, the first 1
    turns              int16            model turns of the episode, >= 1
    tool_calls         int32            tool calls the model made, >= 0
    tool_errors        int32            of those, answered with an error: 0..tool_calls
    episode_end        int8             index into ``asyncrl.core.types.EPISODE_ENDS``
    part               int16            ``Sample.part``: 0 an episode's sample, k >= 1 its
                                        k-th other call chain, right after part k-1

Group-level fields live in the schema metadata (not as constant columns: they are scalars
of the group, and metadata keeps them out of the per-row buffers)::

    asyncrl.schema_version  "4". Older versions, written before their columns existed,
                            are still decoded, so a buffer kept across an upgrade stays
                            readable: "3" without ``part`` (every row part 0), "2"
                            without the five episode columns too (a one-turn
                            episode: mask all 1, 1 turn, 0 calls, "done"), "1" without
                            reward_extras too ({} extras)
    asyncrl.group_id        non-empty utf-8 string
    asyncrl.prompt_index    decimal int >= 0
    asyncrl.actor_id        decimal int >= 0
    asyncrl.version_min     decimal int, == min(token_versions over all rows)
    asyncrl.version_max     decimal int, == max(token_versions over all rows)

``decode_group`` trusts nothing: payloads cross a process boundary, so every property above
is checked and any violation raises ``PayloadError`` with a specific reason (the buffer
dead-letters the entry with that reason). Nothing here pickles or evaluates code.
"""

from __future__ import annotations

import math
import re
import struct

import pyarrow as pa
import pyarrow.compute as pc

from asyncrl.core.types import (
    EPISODE_ENDS,
    FINISH_REASONS,
    MAX_REWARD_EXTRAS,
    Group,
    Sample,
    episode_problem,
)

SCHEMA_VERSION = 4
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""64 MiB: 5x a large group (64 samples x 16k tokens x 13 bytes/token is ~13 MiB)."""

_INT_RE = re.compile(r"-?[0-9]{1,18}")
_INT_META = ("prompt_index", "actor_id", "version_min", "version_max")

SCHEMA = pa.schema(
    [
        pa.field("prompt_ids", pa.list_(pa.int32())),
        pa.field("completion_ids", pa.list_(pa.int32())),
        pa.field("behavior_logprobs", pa.list_(pa.float32())),
        pa.field("token_versions", pa.list_(pa.int32())),
        pa.field("reward", pa.float32()),
        pa.field("finish_reason", pa.int8()),
        pa.field("reward_error", pa.string()),
        pa.field("reward_extras", pa.map_(pa.string(), pa.float64())),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("turns", pa.int16()),
        pa.field("tool_calls", pa.int32()),
        pa.field("tool_errors", pa.int32()),
        pa.field("episode_end", pa.int8()),
        pa.field("part", pa.int16()),
    ]
)
"""The exact column schema (metadata aside) every payload ``encode_group`` writes has."""
_SCHEMAS = {
    "4": SCHEMA,
    "3": pa.schema(list(SCHEMA)[:13]),
    "2": pa.schema(list(SCHEMA)[:8]),
    "1": pa.schema(list(SCHEMA)[:7]),
}
"""The column schema each readable ``asyncrl.schema_version`` must have."""
_ONE_TURN = {"turns": 1, "tool_calls": 0, "tool_errors": 0, "episode_end": 0, "part": 0}
"""A version 1 or 2 row's episode columns (loss_mask: all ones); a version 3 row's part."""


class PayloadError(ValueError):
    """A payload that is not a valid encoded group; ``reason`` says what is wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode_group(group: Group) -> bytes:
    """Serialize ``group`` to Arrow IPC stream bytes (see the module docstring for the layout).

    Raises ``ValueError`` if the group breaks the ``Sample`` invariants, so a bad group is
    rejected by the actor that built it rather than dead-lettered by the learner.
    """
    for i, s in enumerate(group.samples):
        n = len(s.completion_ids)
        if not n == len(s.behavior_logprobs) == len(s.token_versions):
            raise ValueError(
                f"group {group.group_id!r} sample {i}: completion_ids ({n}), behavior_logprobs "
                f"({len(s.behavior_logprobs)}) and token_versions ({len(s.token_versions)}) "
                "must have the same length"
            )
        if s.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"sample {i}: finish_reason {s.finish_reason!r} not in {FINISH_REASONS}"
            )
        if reason := _extras_problem(list(s.reward_extras.items())) or episode_problem(s):
            raise ValueError(f"group {group.group_id!r} sample {i}: {reason}")
    ss = group.samples
    columns = [
        [s.prompt_ids for s in ss],
        [s.completion_ids for s in ss],
        [s.behavior_logprobs for s in ss],
        [s.token_versions for s in ss],
        [s.reward for s in ss],
        [FINISH_REASONS.index(s.finish_reason) for s in ss],
        [s.reward_error for s in ss],
        [list(s.reward_extras.items()) for s in ss],
        [s.loss_mask if s.loss_mask is not None else [1] * len(s.completion_ids) for s in ss],
        [s.turns for s in ss],
        [s.tool_calls for s in ss],
        [s.tool_errors for s in ss],
        [EPISODE_ENDS.index(s.episode_end) for s in ss],
        [s.part for s in ss],
    ]
    arrays = [pa.array(col, type=f.type) for col, f in zip(columns, SCHEMA, strict=True)]
    meta = {"asyncrl.schema_version": str(SCHEMA_VERSION), "asyncrl.group_id": group.group_id}
    meta.update({f"asyncrl.{k}": str(int(getattr(group, k))) for k in _INT_META})
    batch = pa.RecordBatch.from_arrays(arrays, schema=SCHEMA.with_metadata(meta))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def warm_up() -> None:
    """Encode and decode one tiny group, untimed: the first ``pa.array`` call imports what
    pyarrow loads lazily (pandas, when installed: ~0.6 s here), which would otherwise land in
    an actor's first commit. ``asyncrl.actors.main`` runs this while the engine starts."""
    sample = Sample([1], [2], [-0.5], [0], 1.0)
    decode_group(encode_group(Group("warm-up", 0, 0, [sample])))


def decode_group(
    payload: bytes, vocab_size: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES
) -> Group:
    """Parse and fully validate one payload; raise ``PayloadError(reason)`` on anything wrong.

    ``vocab_size``: when given, every prompt and completion token id must be in
    ``[0, vocab_size)``; without it only ``>= 0`` is checked.
    """
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise PayloadError(f"payload must be bytes, got {type(payload).__name__}")
    if len(payload) > max_bytes:
        raise PayloadError(f"payload is {len(payload)} bytes, over the {max_bytes}-byte limit")
    batch = _read_single_batch(payload)
    try:
        meta = _check_schema(batch.schema)
        _check_values(batch, vocab_size)
        _check_versions(batch, meta["version_min"], meta["version_max"])
        cols = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    except UnicodeDecodeError as e:
        # Arrow's full validation does not check utf-8 of every string; Python does.
        raise PayloadError(f"invalid utf-8 in a name or string value: {e}") from None
    if any(p != cols["prompt_ids"][0] for p in cols["prompt_ids"]):
        raise PayloadError("prompt_ids differ between samples of one group")
    rows = batch.num_rows
    extras = cols.get("reward_extras", [[]] * rows)  # version 1: none
    for name, default in _ONE_TURN.items():  # versions 1 and 2: one-turn episodes
        cols.setdefault(name, [default] * rows)
    for i, items in enumerate(extras):
        if reason := _extras_problem(items):
            raise PayloadError(f"row {i}: {reason}")
    samples = [_sample(cols, i, extras[i]) for i in range(rows)]
    try:
        return Group(samples=samples, **meta)
    except ValueError as e:  # parts out of order (asyncrl.core.types.episode_index)
        raise PayloadError(str(e)) from None


def _sample(cols: dict[str, list], i: int, extras: list) -> Sample:
    """Row ``i`` as a ``Sample``, whose constructor checks the episode fields (the rule lives
    in ``asyncrl.core.types.episode_problem``): a bad one is a PayloadError naming the row."""
    try:
        return Sample(
            prompt_ids=cols["prompt_ids"][i],
            completion_ids=cols["completion_ids"][i],
            behavior_logprobs=cols["behavior_logprobs"][i],
            token_versions=cols["token_versions"][i],
            reward=cols["reward"][i],
            finish_reason=FINISH_REASONS[cols["finish_reason"][i]],
            reward_error=cols["reward_error"][i],
            reward_extras=dict(extras),
            loss_mask=cols["loss_mask"][i] if "loss_mask" in cols else None,
            turns=cols["turns"][i],
            tool_calls=cols["tool_calls"][i],
            tool_errors=cols["tool_errors"][i],
            episode_end=EPISODE_ENDS[cols["episode_end"][i]],
            part=cols["part"][i],
        )
    except ValueError as e:
        raise PayloadError(f"row {i}: {e}") from None


def _read_single_batch(payload: bytes) -> pa.RecordBatch:
    """The one record batch of an IPC stream, structurally validated (offsets, buffer sizes)."""
    _check_messages(payload)
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(payload))
    except (pa.ArrowException, OSError, ValueError) as e:
        raise PayloadError(f"not an Arrow IPC stream: {e}") from None
    try:
        batches = list(reader)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise PayloadError(f"truncated or corrupt Arrow IPC stream: {e}") from None
    if len(batches) != 1:
        raise PayloadError(f"expected exactly 1 record batch, got {len(batches)}")
    batch = batches[0]
    try:
        # Full validation before touching any value: a corrupt offset buffer must become a
        # PayloadError here, not an out-of-bounds read later.
        batch.validate(full=True)
    except (pa.ArrowException, ValueError) as e:
        raise PayloadError(f"record batch fails Arrow validation: {e}") from None
    return batch


_MESSAGE_TYPES = ("schema", "record batch")


def _check_messages(payload: bytes) -> None:
    """Only a schema and record batches, none with a compressed body, before decoding any.

    encode_group never compresses. A compressed body (or a dictionary batch) would be
    expanded by the IPC reader before any other check: a payload of a few KB can claim GBs
    (a decompression bomb that stalls or kills the learner), so it is refused unread.
    """
    read = 0
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(payload))
        while True:
            try:
                msg = reader.read_next_message()
            except StopIteration:
                return
            read += 1
            if msg.type not in _MESSAGE_TYPES:
                raise PayloadError(f"unexpected Arrow IPC message {msg.type!r} (dictionaries?)")
            if msg.type == "record batch" and _body_compressed(msg.metadata.to_pybytes()):
                raise PayloadError(
                    "compressed Arrow IPC record batch: compression is not accepted (a small "
                    "payload could expand without bound); encode with encode_group"
                )
    except PayloadError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:
        what = "truncated or corrupt Arrow IPC stream" if read else "not an Arrow IPC stream"
        raise PayloadError(f"{what}: {e}") from None


def _body_compressed(fb: bytes) -> bool:
    """Whether a RecordBatch message's flatbuffer (Message.fbs) sets ``compression``.

    Message: slot 1 header_type (3 = RecordBatch), slot 2 header; RecordBatch: slot 3
    compression. Read by hand (pyarrow has no accessor); any bad offset is a PayloadError.
    """

    def slot(table: int, k: int) -> int | None:
        vtable = table - struct.unpack_from("<i", fb, table)[0]
        vtable_len = struct.unpack_from("<H", fb, vtable)[0]
        if vtable < 0 or 4 + 2 * k >= vtable_len:
            return None
        off = struct.unpack_from("<H", fb, vtable + 4 + 2 * k)[0]
        return table + off if off else None

    try:
        root = struct.unpack_from("<I", fb, 0)[0]
        header_type, header = slot(root, 1), slot(root, 2)
        if header_type is None or header is None or fb[header_type] != 3:
            raise PayloadError("record batch message without a RecordBatch header")
        batch = header + struct.unpack_from("<I", fb, header)[0]
        return slot(batch, 3) is not None
    except (struct.error, IndexError):
        raise PayloadError("corrupt Arrow IPC message header (flatbuffer offsets)") from None


def _check_schema(schema: pa.Schema) -> dict:
    """Check columns and metadata; return the group-level constructor kwargs."""
    raw = schema.metadata or {}
    try:
        meta = {k.decode(): v.decode() for k, v in raw.items()}
    except UnicodeDecodeError:
        raise PayloadError("schema metadata is not valid utf-8") from None
    version = meta.get("asyncrl.schema_version")
    expected = _SCHEMAS.get(version) if version is not None else None
    if expected is None:
        raise PayloadError(
            f"schema version is {version!r}, expected {str(SCHEMA_VERSION)!r} (or '3', '2', '1')"
        )
    if not schema.remove_metadata().equals(expected):
        missing = [n for n in expected.names if n not in schema.names]
        if missing:
            raise PayloadError(f"missing column(s) {missing}")
        raise PayloadError(f"schema mismatch: got {schema.remove_metadata()}, expected {expected}")
    out: dict = {"group_id": meta.get("asyncrl.group_id", "")}
    if not out["group_id"]:
        raise PayloadError("metadata asyncrl.group_id is missing or empty")
    for key in _INT_META:
        text = meta.get(f"asyncrl.{key}")
        if text is None or not _INT_RE.fullmatch(text):
            raise PayloadError(f"metadata asyncrl.{key} is {text!r}, expected a decimal integer")
        out[key] = int(text)
    for key in ("prompt_index", "actor_id"):
        if out[key] < 0:
            raise PayloadError(f"metadata asyncrl.{key} is {out[key]}, expected >= 0")
    return out


def _check_values(batch: pa.RecordBatch, vocab_size: int | None) -> None:
    """Per-row length agreement and value ranges, vectorized with pyarrow.compute."""
    if batch.num_rows < 1:
        raise PayloadError("group has no samples (0 rows)")
    for name in batch.schema.names:
        col = batch.column(name)
        if col.null_count or (pa.types.is_list(col.type) and col.flatten().null_count):
            raise PayloadError(f"column {name} contains nulls")
    per_token = [*SCHEMA.names[:4], *(["loss_mask"] if "loss_mask" in batch.schema.names else [])]
    lengths = {n: pc.list_value_length(batch.column(n)) for n in per_token}
    c_len = lengths["completion_ids"]
    if pc.min(c_len).as_py() < 1:
        raise PayloadError("empty completion: every sample needs >= 1 completion token")
    for other in per_token[2:]:
        if not pc.all(pc.equal(c_len, lengths[other])).as_py():
            row = pc.index(pc.equal(c_len, lengths[other]), False).as_py()
            raise PayloadError(
                f"row {row}: completion_ids has {c_len[row].as_py()} tokens but {other} has "
                f"{lengths[other][row].as_py()}"
            )
    if pc.min(lengths["prompt_ids"]).as_py() < 1:
        raise PayloadError("empty prompt: every sample needs >= 1 prompt token")
    for name in ("prompt_ids", "completion_ids"):
        lo, hi = _min_max(batch.column(name).flatten())
        if lo < 0:
            raise PayloadError(f"{name}: negative token id {lo}")
        if vocab_size is not None and hi >= vocab_size:
            raise PayloadError(f"{name}: token id {hi} >= vocab_size {vocab_size}")
    logprobs = batch.column("behavior_logprobs").flatten()
    if not pc.all(pc.is_finite(logprobs)).as_py():
        raise PayloadError("behavior_logprobs: NaN or infinite value")
    if _min_max(logprobs)[1] > 0:
        raise PayloadError(f"behavior_logprobs: positive log-prob {_min_max(logprobs)[1]}")
    if not pc.all(pc.is_finite(batch.column("reward"))).as_py():
        raise PayloadError("reward: NaN or infinite value")
    lo, hi = _min_max(batch.column("finish_reason"))
    if lo < 0 or hi >= len(FINISH_REASONS):
        raise PayloadError(f"finish_reason code out of range [0, {len(FINISH_REASONS)})")
    if "episode_end" in batch.schema.names:  # version 3
        lo, hi = _min_max(batch.column("episode_end"))
        if lo < 0 or hi >= len(EPISODE_ENDS):
            raise PayloadError(f"episode_end code out of range [0, {len(EPISODE_ENDS)})")


def _extras_problem(items: list[tuple[str, float | None]]) -> str:
    """What is wrong with one sample's ``reward_extras`` items ("" if nothing): at most
    ``MAX_REWARD_EXTRAS`` distinct non-empty keys, finite values."""
    if len(items) > MAX_REWARD_EXTRAS:
        return f"reward_extras has {len(items)} keys, more than {MAX_REWARD_EXTRAS}"
    if len({k for k, _ in items}) < len(items):
        return "reward_extras repeats a key"
    for key, value in items:
        if not isinstance(key, str) or not key:
            return f"reward_extras key {key!r} is not a non-empty string"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"reward_extras[{key!r}] is {value!r}, expected a finite number"
        if not math.isfinite(value):
            return f"reward_extras[{key!r}]: NaN or infinite value"
    return ""


def _check_versions(batch: pa.RecordBatch, version_min: int, version_max: int) -> None:
    """Versions are >= 0 and the group's claimed range is exactly the tokens' range."""
    lo, hi = _min_max(batch.column("token_versions").flatten())
    if lo < 0:
        raise PayloadError(f"token_versions: negative version {lo}")
    claimed = (version_min, version_max)
    if claimed != (lo, hi):
        raise PayloadError(
            f"version_min/version_max {claimed} disagree with token_versions range {(lo, hi)}"
        )


def _min_max(values: pa.Array) -> tuple[float, float]:
    mm = pc.min_max(values)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if lo is None or (isinstance(lo, float) and math.isnan(lo)):
        raise PayloadError("no values to range-check")
    return lo, hi
