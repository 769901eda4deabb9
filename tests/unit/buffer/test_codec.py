"""The Arrow codec against the Group record: exact round trips, and every rejection reason."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from asyncrl.buffer.codec import SCHEMA, PayloadError, decode_group, encode_group
from asyncrl.buffer.testing import random_group
from asyncrl.core.types import EPISODE_ENDS, FINISH_REASONS, MAX_REWARD_EXTRAS, Group, Sample

VOCAB = 50


EXTRAS = {"acc": 1.0, "format": 0.5}
EPISODE = {"loss_mask": [1, 1, 0, 1], "turns": 2, "tool_calls": 1, "tool_errors": 1}
"""Sample 0 of ``_group``: two model turns around one environment token (a tool's error)."""
EPISODE_COLUMNS = ["loss_mask", "turns", "tool_calls", "tool_errors", "episode_end"]
"""What schema version 3 added."""


def _group() -> Group:
    return Group(
        group_id="3:17",
        prompt_index=17,
        actor_id=3,
        samples=[
            Sample(
                [1, 2, 3],
                [4, 5, 0, 6],
                [-0.5, -0.25, 0.0, -1.0],
                [2, 2, 2, 3],
                1.0,
                reward_extras=EXTRAS,
                episode_end="max_turns",
                **EPISODE,
            ),
            Sample([1, 2, 3], [7], [-2.0], [2], 0.0, "length", "reward timed out"),
        ],
    )


def _one_turn(g: Group) -> Group:
    """``g`` as versions 1 and 2 decode it: every sample a one-turn episode."""
    for s in g.samples:
        s.loss_mask, s.turns, s.tool_calls, s.tool_errors = [1] * len(s.completion_ids), 1, 0, 0
        s.episode_end = "done"
    return g


def _columns(group: Group) -> dict[str, list]:
    ss = group.samples
    return {
        "prompt_ids": [s.prompt_ids for s in ss],
        "completion_ids": [s.completion_ids for s in ss],
        "behavior_logprobs": [s.behavior_logprobs for s in ss],
        "token_versions": [s.token_versions for s in ss],
        "reward": [s.reward for s in ss],
        "finish_reason": [FINISH_REASONS.index(s.finish_reason) for s in ss],
        "reward_error": [s.reward_error for s in ss],
        "reward_extras": [list(s.reward_extras.items()) for s in ss],
        "loss_mask": [s.loss_mask for s in ss],
        "turns": [s.turns for s in ss],
        "tool_calls": [s.tool_calls for s in ss],
        "tool_errors": [s.tool_errors for s in ss],
        "episode_end": [EPISODE_ENDS.index(s.episode_end) for s in ss],
        "part": [s.part for s in ss],
    }


def _meta(group: Group) -> dict[str, str]:
    return {
        "asyncrl.schema_version": "4",
        "asyncrl.group_id": group.group_id,
        "asyncrl.prompt_index": str(group.prompt_index),
        "asyncrl.actor_id": str(group.actor_id),
        "asyncrl.version_min": str(group.version_min),
        "asyncrl.version_max": str(group.version_max),
    }


def _payload(columns: dict, meta: dict, types: dict | None = None, batches: int = 1) -> bytes:
    """Hand-built IPC bytes, bypassing encode_group's checks (the wire may carry anything)."""
    types = {f.name: f.type for f in SCHEMA} | (types or {})
    arrays = {k: pa.array(v, type=types[k]) for k, v in columns.items()}
    batch = pa.RecordBatch.from_pydict(arrays).replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        for _ in range(batches):
            w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def test_hand_built_payload_matches_encoder() -> None:
    g = _group()
    assert _payload(_columns(g), _meta(g)) == encode_group(g)


@pytest.mark.parametrize("seed", range(300))
def test_round_trip_random_groups(seed: int) -> None:
    g = random_group(random.Random(seed), vocab_size=VOCAB)
    assert decode_group(encode_group(g), vocab_size=VOCAB) == g


@pytest.mark.parametrize("seed", range(100))
def test_round_trip_random_multi_turn_groups(seed: int) -> None:
    g = random_group(random.Random(seed), vocab_size=VOCAB, multi_turn=True)
    assert decode_group(encode_group(g), vocab_size=VOCAB) == g


def test_a_multi_turn_sample_round_trips_field_by_field() -> None:
    s = decode_group(encode_group(_group())).samples[0]
    got = {k: getattr(s, k) for k in [*EPISODE, "episode_end", "behavior_logprobs"]}
    assert got == {
        **EPISODE,
        "episode_end": "max_turns",
        "behavior_logprobs": [-0.5, -0.25, 0.0, -1.0],
    }
    assert s.model_tokens == 3


def _set(col: str, row: int, value):
    def edit(c: dict, m: dict) -> None:
        c[col][row] = value

    return edit


def _set_meta(key: str, value):
    def edit(c: dict, m: dict) -> None:
        if value is None:
            del m[key]
        else:
            m[key] = value

    return edit


def _drop(col: str):
    return lambda c, m: c.pop(col)


def _empty_rows(c: dict, m: dict) -> None:
    for v in c.values():
        v.clear()


REJECTIONS = {
    "wrong schema version": (_set_meta("asyncrl.schema_version", "5"), "schema version is '5'"),
    "v3 with part": (_set_meta("asyncrl.schema_version", "3"), "schema mismatch"),
    "negative part": (_set("part", 1, -1), "row 1: Sample.part is -1"),
    "part 1 first": (
        _set("part", 0, 1),
        "sample 0 is part 1: a group opens with an episode's part 0",
    ),
    "part 2 after 0": (_set("part", 1, 2), "sample 1 is part 2 after part 0"),
    "v1 with extras": (_set_meta("asyncrl.schema_version", "1"), "schema mismatch"),
    "v2 with episodes": (_set_meta("asyncrl.schema_version", "2"), "schema mismatch"),
    "missing loss_mask": (_drop("loss_mask"), "missing column(s) ['loss_mask']"),
    "mask shorter": (
        _set("loss_mask", 0, [1, 1, 0]),
        "row 0: completion_ids has 4 tokens but loss_mask has 3",
    ),
    "mask longer": (
        _set("loss_mask", 1, [1, 1]),
        "row 1: completion_ids has 1 tokens but loss_mask",
    ),
    "mask value 2": (
        _set("loss_mask", 0, [1, 2, 0, 1]),
        "row 0: Sample.loss_mask values must be 0 or 1",
    ),
    "mask value -1": (_set("loss_mask", 1, [-1]), "row 1: Sample.loss_mask values must be 0 or 1"),
    "null mask value": (_set("loss_mask", 0, [1, None, 0, 1]), "column loss_mask contains nulls"),
    "zero turns": (_set("turns", 1, 0), "row 1: Sample.turns is 0, expected an int >= 1"),
    "negative tool_calls": (_set("tool_calls", 1, -2), "row 1: Sample.tool_calls is -2"),
    "negative tool_errors": (_set("tool_errors", 1, -1), "row 1: Sample.tool_errors is -1"),
    "more errors than calls": (
        _set("tool_errors", 0, 2),
        "row 0: Sample.tool_errors (2) exceeds tool_calls (1)",
    ),
    "episode_end code": (
        _set("episode_end", 1, len(EPISODE_ENDS)),
        "episode_end code out of range",
    ),
    "negative episode_end": (_set("episode_end", 0, -1), "episode_end code out of range"),
    "null turns": (_set("turns", 0, None), "column turns contains nulls"),
    "no schema version": (_set_meta("asyncrl.schema_version", None), "schema version is None"),
    "missing column": (_drop("token_versions"), "missing column(s) ['token_versions']"),
    "token id >= vocab": (
        _set("completion_ids", 0, [4, VOCAB, 9, 6]),
        f"token id {VOCAB} >= vocab",
    ),
    "prompt id >= vocab": (_set("prompt_ids", 1, [1, 2, 99]), "prompt_ids: token id 99"),
    "negative token id": (_set("completion_ids", 1, [-3]), "negative token id -3"),
    "logprobs shorter": (
        _set("behavior_logprobs", 0, [-0.5, -0.25]),
        "row 0: completion_ids has 4 tokens but behavior_logprobs has 2",
    ),
    "versions longer": (
        _set("token_versions", 1, [2, 2]),
        "row 1: completion_ids has 1 tokens but token_versions has 2",
    ),
    "NaN logprob": (_set("behavior_logprobs", 0, [-0.5, float("nan"), 0, -1.0]), "NaN or infinite"),
    "inf logprob": (_set("behavior_logprobs", 1, [float("-inf")]), "NaN or infinite"),
    "positive logprob": (_set("behavior_logprobs", 1, [0.5]), "positive log-prob 0.5"),
    "NaN reward": (_set("reward", 0, float("nan")), "reward: NaN or infinite"),
    "empty completion": (
        lambda c, m: [c[k].__setitem__(1, []) for k in [*list(c)[1:4], "loss_mask"]],
        "empty completion",
    ),
    "empty prompt": (
        lambda c, m: [c["prompt_ids"].__setitem__(i, []) for i in (0, 1)],
        "empty prompt",
    ),
    "prompts differ": (_set("prompt_ids", 1, [1, 2, 4]), "prompt_ids differ"),
    "finish_reason code": (_set("finish_reason", 0, 7), "finish_reason code out of range"),
    "null reward": (_set("reward", 1, None), "column reward contains nulls"),
    "null token": (_set("completion_ids", 1, [None]), "column completion_ids contains nulls"),
    "no rows": (_empty_rows, "no samples (0 rows)"),
    "version_min wrong": (_set_meta("asyncrl.version_min", "1"), "disagree with token_versions"),
    "version_max wrong": (_set_meta("asyncrl.version_max", "9"), "disagree with token_versions"),
    "negative version": (_set("token_versions", 1, [-1]), "negative version -1"),
    "no group_id": (_set_meta("asyncrl.group_id", None), "asyncrl.group_id is missing"),
    "bad actor_id": (_set_meta("asyncrl.actor_id", "x1"), "asyncrl.actor_id is 'x1'"),
    "negative prompt_index": (_set_meta("asyncrl.prompt_index", "-4"), "prompt_index is -4"),
    "NaN extra": (_set("reward_extras", 0, [("acc", float("nan"))]), "['acc']: NaN or infinite"),
    "null extra": (_set("reward_extras", 1, [("acc", None)]), "['acc'] is None"),
    "null extras": (_set("reward_extras", 1, None), "column reward_extras contains nulls"),
    "repeated extra": (_set("reward_extras", 0, [("a", 1.0), ("a", 2.0)]), "repeats a key"),
    "empty extra key": (_set("reward_extras", 0, [("", 1.0)]), "key '' is not a non-empty"),
    "too many extras": (
        _set("reward_extras", 0, [(f"k{i}", 1.0) for i in range(MAX_REWARD_EXTRAS + 1)]),
        f"more than {MAX_REWARD_EXTRAS}",
    ),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_rejects_with_specific_reason(case: str) -> None:
    edit, expected = REJECTIONS[case]
    g = _group()
    columns, meta = _columns(g), _meta(g)
    edit(columns, meta)
    with pytest.raises(PayloadError) as err:
        decode_group(_payload(columns, meta), vocab_size=VOCAB)
    assert expected in err.value.reason
    assert isinstance(err.value, ValueError)


def test_reward_extras_round_trip() -> None:
    g = decode_group(encode_group(_group()))
    assert [s.reward_extras for s in g.samples] == [EXTRAS, {}]


def test_version_1_payloads_still_decode_without_extras() -> None:
    """Groups written before reward extras existed (a buffer kept across an upgrade)."""
    g = _group()
    columns, meta = _columns(g), _meta(g) | {"asyncrl.schema_version": "1"}
    for name in ["reward_extras", *EPISODE_COLUMNS, "part"]:
        del columns[name]
    decoded = decode_group(_payload(columns, meta), vocab_size=VOCAB)
    g.samples[0].reward_extras = {}
    assert decoded == _one_turn(g)


def _version_2(group: Group) -> bytes:
    """``group`` encoded as ``encode_group`` did before the episode columns (schema 2)."""
    schema = pa.schema([f for f in SCHEMA if f.name not in [*EPISODE_COLUMNS, "part"]])
    meta = _meta(group) | {"asyncrl.schema_version": "2"}
    columns = {f.name: col for f, col in zip(SCHEMA, _columns(group).values(), strict=True)}
    arrays = [pa.array(columns[f.name], type=f.type) for f in schema]
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema.with_metadata(meta))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("seed", range(20))
def test_version_2_payloads_still_decode_as_one_turn_episodes(seed: int) -> None:
    """Groups written before multi-turn episodes: all-ones masks, 1 turn, no calls, done."""
    g = random_group(random.Random(seed), vocab_size=VOCAB)
    assert decode_group(_version_2(g), vocab_size=VOCAB) == g
    decoded = decode_group(_version_2(_group()), vocab_size=VOCAB)
    assert decoded == _one_turn(_group())
    assert decoded.samples[0].loss_mask == [1, 1, 1, 1] and decoded.samples[0].model_tokens == 4


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("loss_mask", [1, 1, 0], "sample 0: loss_mask has 3 values but completion_ids 4"),
        ("loss_mask", [1, 3, 0, 1], "sample 0: loss_mask values must be 0 or 1"),
        ("turns", 0, "sample 0: turns is 0"),
        ("tool_calls", -1, "sample 0: tool_calls is -1"),
        ("tool_errors", 2, r"sample 0: tool_errors \(2\) exceeds tool_calls \(1\)"),
        ("episode_end", "finished", "sample 0: episode_end 'finished' not in"),
    ],
)
def test_encode_rejects_a_bad_episode(field: str, value, reason: str) -> None:
    """Set after construction (a sample is mutable): the encoder checks again."""
    g = _group()
    setattr(g.samples[0], field, value)
    with pytest.raises(ValueError, match=reason):
        encode_group(g)


def test_encode_rejects_bad_extras() -> None:
    g = _group()
    g.samples[1].reward_extras = {"acc": float("inf")}
    with pytest.raises(ValueError, match=r"sample 1: reward_extras\['acc'\]: NaN or infinite"):
        encode_group(g)


def test_rejects_wrong_column_type() -> None:
    g = _group()
    payload = _payload(_columns(g), _meta(g), types={"completion_ids": pa.list_(pa.int64())})
    with pytest.raises(PayloadError, match="schema mismatch"):
        decode_group(payload)


def test_rejects_two_batches() -> None:
    g = _group()
    with pytest.raises(PayloadError, match="expected exactly 1 record batch, got 2"):
        decode_group(_payload(_columns(g), _meta(g), batches=2))


def test_rejects_oversized_payload() -> None:
    payload = encode_group(_group())
    with pytest.raises(PayloadError, match=f"{len(payload)} bytes, over the 100-byte limit"):
        decode_group(payload, max_bytes=100)
    assert decode_group(payload, max_bytes=len(payload)) == _group()


def test_vocab_check_is_optional() -> None:
    assert decode_group(encode_group(_group()), vocab_size=None) == _group()
    with pytest.raises(PayloadError, match="token id 7 >= vocab_size 7"):
        decode_group(encode_group(_group()), vocab_size=7)


@pytest.mark.parametrize("seed", range(100))
def test_rejects_random_bytes(seed: int) -> None:
    rng = random.Random(seed)
    with pytest.raises(PayloadError, match="not an Arrow IPC stream"):
        decode_group(rng.randbytes(rng.randrange(0, 4000)))


@pytest.mark.parametrize("cut", [8, 200, 600, -120, -40])
def test_rejects_truncated_stream(cut: int) -> None:
    payload = encode_group(_group())
    with pytest.raises(PayloadError, match="Arrow IPC stream"):
        decode_group(payload[:cut])


def test_truncated_body_says_truncated() -> None:
    with pytest.raises(PayloadError, match="truncated or corrupt Arrow IPC stream"):
        decode_group(encode_group(_group())[:-40])


def test_random_corruption_never_escapes_as_another_error() -> None:
    """Flipped bytes either still decode to a valid group or raise PayloadError, nothing else."""
    rng = random.Random(1234)
    base = encode_group(random_group(rng, vocab_size=VOCAB))
    outcomes = {"ok": 0, "rejected": 0}
    for _ in range(400):
        mutated = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        try:
            g = decode_group(bytes(mutated), vocab_size=VOCAB)
        except PayloadError:
            outcomes["rejected"] += 1
        else:
            outcomes["ok"] += 1
            assert decode_group(encode_group(g), vocab_size=VOCAB) == g
    assert outcomes["rejected"] > 300, outcomes


def test_encode_rejects_malformed_group() -> None:
    bad = Group("0:1", 1, 0, [Sample([1], [2, 3], [-1.0], [0, 0], 0.0)])
    with pytest.raises(ValueError, match="same length"):
        encode_group(bad)
    odd = Group("0:1", 1, 0, [Sample([1], [2], [-1.0], [0], 0.0, finish_reason="eos")])
    with pytest.raises(ValueError, match="finish_reason 'eos'"):
        encode_group(odd)


def _version_3(group: Group) -> bytes:
    """``group`` encoded as ``encode_group`` did before ``Sample.part`` (schema 3)."""
    columns = _columns(group)
    del columns["part"]
    return _payload(columns, _meta(group) | {"asyncrl.schema_version": "3"})


def test_version_3_payloads_still_decode_one_sample_per_episode() -> None:
    g = _group()
    decoded = decode_group(_version_3(g), vocab_size=VOCAB)
    assert decoded == g and [s.part for s in decoded.samples] == [0, 0]


def test_an_episode_of_several_parts_round_trips() -> None:
    """``episode.agent_export=all``: an episode's other call chains follow it (part 1, 2);
    the group's rewards and episodes are per episode."""
    g = _group()
    extra = [Sample([1, 2, 3], [8, 9], [-0.5, -0.25], [3, 3], 1.0, part=k) for k in (1, 2)]
    g = Group(g.group_id, g.prompt_index, g.actor_id, [g.samples[0], *extra, g.samples[1]])
    decoded = decode_group(encode_group(g), vocab_size=VOCAB)
    assert decoded == g and [s.part for s in decoded.samples] == [0, 1, 2, 0]
    assert decoded.rewards == [1.0, 0.0] and len(decoded.episodes) == 2
