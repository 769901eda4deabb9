"""The ``file`` task (actors/data/datafile.py, actors/data/file_source.py) over real parquet and JSON Lines
files and the demo model's real tokenizer: reward fields (dotted keys, reserved names), chat
and plain prompts, templates, the length filter and its report, seeded epochs, and the
message of every kind of bad input."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncrl.actors.data.datafile import DataError, DataKeys, read_rows
from asyncrl.actors.data.file_source import FileSource, load_template
from asyncrl.actors.data.tasks import (
    TASKS,
    build_prompt_source,
    check_data,
    example_fields,
    max_model_len,
)
from asyncrl.core.config.load import ConfigError, load_config
from asyncrl.orchestration.demo.tokenizer import CHAT_TEMPLATE, save_tokenizer

VERL_ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"what is {i}+{i}?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
        "extra_info": {"split": "train", "index": i},
    }
    for i in range(12)
]
VERL = ["data.prompt_key=prompt", "data.answer_key=reward_model.ground_truth",
        "data.data_source_key=data_source", "data.extra_info_key=extra_info"]  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The demo tokenizer (with its chat template) and a config.json giving its context."""
    path = tmp_path_factory.mktemp("demo_tok")
    save_tokenizer(path)
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def write_parquet(path, rows) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def cfg_for(files, *overrides):
    return load_config(
        ["task=file", f"data.train_files=[{','.join(files)}]", "experiment=tiny", *overrides]
    )


def source(cfg, model_dir, logs=None):
    return build_prompt_source(cfg, model_dir, (logs if logs is not None else []).append)


# -- fields and formatting --------------------------------------------------------------------


def test_verl_parquet_chat_prompts_and_reward_fields(tmp_path, model_dir, tokenizer):
    f = write_parquet(tmp_path / "train.parquet", VERL_ROWS)
    src = source(cfg_for([f], *VERL, "data.shuffle=false"), model_dir)
    p = src.get(3)
    row = VERL_ROWS[3]
    assert p.text == "user: what is 3+3?\nassistant: "  # the demo chat template, rendered
    want = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert p.token_ids == list(want)
    assert p.messages == row["prompt"]  # a multi-turn episode starts from these
    assert p.fields == {  # every column but the prompt, plus the reserved names
        "data_source": "openai/gsm8k",
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "6"},
        "extra_info": {"split": "train", "index": 3},
        "ground_truth": "6",
    }
    json.dumps(p.fields)  # fields may travel as JSON


def test_jsonl_plain_prompts_are_used_as_they_are(tmp_path, model_dir, tokenizer):
    rows = [{"question": f"{i}+1=", "answer": str(i + 1), "level": i % 3} for i in range(5)]
    f = write_jsonl(tmp_path / "train.jsonl", rows)
    src = source(cfg_for([f], "data.prompt_key=question", "data.shuffle=false"), model_dir)
    p = src.get(2)
    assert p.text == "2+1=" and p.token_ids == tokenizer.encode("2+1=") and p.messages is None
    assert p.fields == {"answer": "3", "level": 2, "ground_truth": "3"}
    assert "data_source" not in p.fields and "extra_info" not in p.fields  # keys not set


def test_files_are_read_in_order_parquet_and_jsonl_together(tmp_path, model_dir):
    a = write_parquet(tmp_path / "a.parquet", [{"prompt": "1+1=", "answer": "2"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "2+2=", "answer": "4"}])
    src = source(cfg_for([a, b], "data.shuffle=false"), model_dir)
    assert [src.get(i).text for i in range(src.end)] == ["1+1=", "2+2="]
    assert example_fields(cfg_for([a, b])) == {"answer": "2", "ground_truth": "2"}


def test_prompt_template_formats_plain_and_chat_prompts(tmp_path, model_dir):
    tpl = tmp_path / "fmt.jinja"
    tpl.write_text("{{ content }} answer in {{ unit }}.\n")
    plain = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1=", "answer": "2", "unit": "cm"}])
    got = source(cfg_for([plain], f"data.prompt_template={tpl}"), model_dir).get(0)
    assert got.text == "1+1= answer in cm."
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2"}]
    c = write_jsonl(tmp_path / "c.jsonl", [{"prompt": chat, "answer": "4", "unit": "m"}])
    got = source(cfg_for([c], f"data.prompt_template={tpl}"), model_dir).get(0)
    assert got.text == "system: be brief\nuser: 2+2 answer in m.\nassistant: "
    assert got.messages == [chat[0], {"role": "user", "content": "2+2 answer in m."}]


def test_demo_tokenizer_has_the_chat_template(tokenizer):
    assert tokenizer.chat_template == CHAT_TEMPLATE
    msgs = [{"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(tokenizer.encode(text)) == text  # every character is in the alphabet


# -- length filter ------------------------------------------------------------------------


def test_long_prompts_are_dropped_at_load_counted_and_one_is_shown(tmp_path, model_dir):
    rows = [{"prompt": "1" * n, "answer": "x"} for n in (3, 40, 5, 50, 8)]
    f = write_jsonl(tmp_path / "t.jsonl", rows)
    logs: list[str] = []
    src = source(cfg_for([f], "data.max_prompt_length=10", "data.shuffle=false"), model_dir, logs)
    assert src.size == 3 and [src.get(i).text for i in range(3)] == ["111", "11111", "1" * 8]
    assert (src.report.records, src.report.dropped, src.report.kept) == (5, 2, 3)
    assert src.report.example.startswith(f"row 1 of {f}: 40 tokens, '1111")
    assert "dropped 2 longer than data.max_prompt_length=10 tokens (e.g. row 1 of" in logs[0]
    with pytest.raises(DataError, match=r"no prompt is left of 5: 5 longer than data\.max_pro"):
        source(cfg_for([f], "data.max_prompt_length=2"), model_dir)


def test_empty_prompts_are_dropped_at_load_counted_and_one_is_shown(tmp_path, model_dir):
    """Formerly, an empty prompt reached vLLM ("decoder prompt cannot be empty") 89 s in."""
    rows = [{"prompt": p, "answer": "x"} for p in ("12", "", "  ", "34")]
    chats = [{"prompt": [{"role": "user", "content": c}], "answer": "x"} for c in (" ", "")]
    f = write_parquet(tmp_path / "t.parquet", rows)
    logs: list[str] = []
    src = source(cfg_for([f], "data.shuffle=false"), model_dir, logs)
    assert src.size == 2 and [src.get(i).text for i in range(2)] == ["12", "34"]
    assert (src.report.empty, src.report.kept) == (2, 2)
    assert f"dropped 2 empty (e.g. row 1 of {f}: '')" in logs[0]
    g = write_jsonl(tmp_path / "e.jsonl", chats)
    with pytest.raises(DataError, match=r"no prompt is left of 2: 2 empty \(e\.g\. row 0 of"):
        source(cfg_for([g]), model_dir)


def test_max_model_len_is_prompt_plus_response_and_must_fit_the_context(tmp_path, model_dir):
    f = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "1+1=", "answer": "2"}] * 4)
    cfg = cfg_for([f], "data.max_prompt_length=200", "sampling.max_tokens=56")
    assert max_model_len(cfg) == 256
    source(cfg, model_dir)  # 256 fits max_position_embeddings=256
    cfg.sampling.max_tokens = 57
    with pytest.raises(DataError, match=re.escape(
        "data.max_prompt_length=200 + sampling.max_tokens=57 = 257 tokens exceeds the model's "
        "context (max_position_embeddings=256 in")):  # fmt: skip
        source(cfg, model_dir)
    assert max_model_len(load_config()) == 64 + 8  # the demo's, as before data.max_prompt_length


# -- epochs and order ---------------------------------------------------------------------


def test_each_epoch_is_a_seeded_permutation_and_the_data_ends(tmp_path, model_dir):
    rows = [{"prompt": f"{i}=", "answer": str(i)} for i in range(20)]
    f = write_parquet(tmp_path / "t.parquet", rows)
    src = source(cfg_for([f], "data.epochs=3", "task.seed=5"), model_dir)
    assert (src.size, src.end) == (20, 60)
    epochs = [[src.get(e * 20 + j).text for j in range(20)] for e in range(3)]
    for order in epochs:
        assert sorted(order) == sorted(r["prompt"] for r in rows)  # each prompt once per epoch
    assert len({tuple(o) for o in epochs}) == 3  # a different order each epoch
    again = source(cfg_for([f], "data.epochs=3", "task.seed=5"), model_dir)
    assert [again.get(i).text for i in (59, 0, 33)] == [epochs[2][19], epochs[0][0], epochs[1][13]]
    other = source(cfg_for([f], "data.epochs=3", "task.seed=6"), model_dir)
    assert [other.get(i).text for i in range(20)] != epochs[0]
    assert [src.epoch_of(i) for i in (0, 19, 20, 59)] == [0, 0, 1, 2]
    with pytest.raises(IndexError, match="outside 0..59"):
        src.get(60)
    unshuffled = source(cfg_for([f], "data.shuffle=false"), model_dir)
    assert [unshuffled.get(i).text for i in range(20)] == [r["prompt"] for r in rows]


def test_actor_strides_cover_every_prompt_of_every_epoch_exactly_once(tmp_path, model_dir):
    """Actor i of K takes i, i+K, ... below ``end`` (actors/actor.py): with N not a multiple
    of K the strides still partition the indices, so each epoch is trained exactly once."""
    f = write_jsonl(tmp_path / "t.jsonl", [{"prompt": f"{i}=", "answer": "0"} for i in range(7)])
    src = source(cfg_for([f], "data.epochs=2"), model_dir)
    k = 3
    taken = [src.get(i).text for a in range(k) for i in range(a, src.end, k)]
    assert sorted(taken) == sorted([f"{i}=" for i in range(7)] * 2)


def test_too_little_data_for_one_learner_step_is_an_error(tmp_path, model_dir):
    f = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "1=", "answer": "1"}] * 3)
    cfg = cfg_for([f], "learner.batch_groups=4")  # tiny: 4 steps of 4 groups
    with pytest.raises(DataError, match=r"3 groups, fewer than one learner step"):
        check_data(cfg, model_dir, print)
    logs: list[str] = []
    check_data(replace(cfg, data=replace(cfg.data, epochs=3)), model_dir, logs.append)
    assert "enough for at most 2 of learner.steps=4 steps" in logs[-1]


# -- bad input --------------------------------------------------------------------------------


def _rows(*files, **keys):
    return read_rows(
        [str(f) for f in files], DataKeys(**{"prompt": "prompt", "answer": "answer", **keys})
    )


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(DataError, match=r"data\.train_files: '.*nope\.parquet' does not exist"):
        _rows(tmp_path / "nope.parquet")
    (tmp_path / "t.csv").write_text("prompt,answer\n")
    with pytest.raises(DataError, match=r"unknown format '\.csv'; give parquet \(\.parquet, \.pq"):
        _rows(tmp_path / "t.csv")
    with pytest.raises(DataError, match=r"data\.train_files is empty"):
        read_rows([], DataKeys("prompt", "answer"))


def test_unreadable_files_name_the_format(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"not a parquet file at all")
    with pytest.raises(DataError, match=r"bad\.parquet' cannot be read as parquet: .*; fix the"):
        _rows(tmp_path / "bad.parquet")
    (tmp_path / "arr.jsonl").write_text('[{"prompt": "a"}, {"prompt": "b"}]\n')
    with pytest.raises(DataError, match=r"cannot be read as JSON Lines \(one JSON object per"):
        _rows(tmp_path / "arr.jsonl")


def test_a_malformed_jsonl_line_is_named_one_based_and_quoted(tmp_path):
    """Issue 43 round 4: line 37 was reported as pyarrow's "row 36"."""
    lines = [json.dumps({"prompt": f"p{i}", "answer": str(i)}) for i in range(40)]
    lines[36] = '{"prompt": "oops", answer: 3}'
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as e:
        _rows(tmp_path / "bad.jsonl")
    assert "line 37 is not a JSON object (Expecting property name enclosed in double quotes " in (
        str(e.value)
    )
    assert """'{"prompt": "oops", answer: 3}'""" in str(e.value)


def test_files_without_rows_are_named_and_an_empty_first_file_is_skipped(tmp_path):
    """Issue 43 round 4: a 0-row parquet gave an IndexError traceback from the reward check,
    even when a later file had rows."""
    from asyncrl.actors.data.datafile import first_row

    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), empty)
    (tmp_path / "one.jsonl").write_text(json.dumps({"prompt": "a", "answer": "1"}) + "\n")
    keys = DataKeys("prompt", "answer")
    assert first_row([str(empty), str(tmp_path / "one.jsonl")], keys).prompt == "a"
    with pytest.raises(DataError, match=r"data.train_files: it has 0 rows \('.*empty.parquet'\)"):
        first_row([str(empty)], DataKeys("prompt", ""))
    with pytest.raises(DataError, match=r"each of the 2 files has 0 rows"):
        read_rows([str(empty), str(empty)], DataKeys("prompt", ""))


def test_missing_column_lists_the_columns(tmp_path):
    f = write_jsonl(tmp_path / "t.jsonl", [{"question": "1+1=", "answer": "2"}])
    with pytest.raises(DataError, match=re.escape(
        f"data.prompt_key='prompt': {f} has no column 'prompt'; its columns: question, answer. "
        "Set data.prompt_key to one of them")):  # fmt: skip
        _rows(f)
    v = write_parquet(tmp_path / "v.parquet", VERL_ROWS[:2])
    with pytest.raises(DataError, match=re.escape(
        "data.answer_key='reward_model.truth': in " + v + ", 'reward_model' has no field "
        "'truth' (its fields: style, ground_truth)")):  # fmt: skip
        _rows(v, answer="reward_model.truth")
    with pytest.raises(DataError, match=r"'ability' has no field 'x' \(it is a string, not a"):
        _rows(v, answer="ability.x")


def test_fields_that_are_not_json_and_reserved_name_clashes(tmp_path):
    t = pa.table({"prompt": ["a"], "answer": ["b"], "blob": pa.array([b"\x00"], pa.binary())})
    pq.write_table(t, tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"column 'blob' has type binary, which cannot be passed"):
        _rows(tmp_path / "b.parquet")
    f = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "a", "answer": "b", "ground_truth": "c"}])
    with pytest.raises(DataError, match=r"column 'ground_truth' would clash with the reward fi"):
        _rows(f)
    assert _rows(f, answer="ground_truth")[0].fields["ground_truth"] == "c"  # the same column


def test_bad_prompt_values_name_the_row(tmp_path):
    f = write_jsonl(
        tmp_path / "t.jsonl", [{"prompt": "ok", "answer": 1}, {"prompt": None, "answer": 2}]
    )
    with pytest.raises(DataError, match=r"row 1 of .*t\.jsonl holds None; expected a string or"):
        _rows(f)
    g = write_jsonl(tmp_path / "m.jsonl", [{"prompt": [{"role": "user"}], "answer": 1}])
    with pytest.raises(DataError, match=r"row 0 of .* holds \[\{'role': 'user'\}\]; expected"):
        _rows(g)


def test_template_errors_name_the_key(tmp_path, model_dir):
    with pytest.raises(DataError, match=r"data\.prompt_template='.*none\.jinja' cannot be read"):
        load_template(str(tmp_path / "none.jinja"))
    (tmp_path / "bad.jinja").write_text("{{ content ")
    with pytest.raises(DataError, match=r"is not a valid Jinja2 template: line 1: "):
        load_template(str(tmp_path / "bad.jinja"))
    (tmp_path / "undef.jinja").write_text("{{ content }} {{ unit }}")
    f = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    with pytest.raises(DataError, match=re.escape(
        "fails on row 0 of " + f + ": UndefinedError: 'unit' is undefined; the template gets "
        "'content' (the prompt) and the record's columns: answer, prompt")):  # fmt: skip
        source(cfg_for([f], f"data.prompt_template={tmp_path / 'undef.jinja'}"), model_dir)


def test_chat_prompts_need_a_chat_template(tmp_path, model_dir, tokenizer):
    f = write_parquet(tmp_path / "t.parquet", VERL_ROWS[:4])
    rows = read_rows([f], DataKeys("prompt", "reward_model.ground_truth"))
    plain = type(tokenizer).from_pretrained(model_dir)
    plain.chat_template = None
    with pytest.raises(DataError, match=r"holds chat messages, but the model's tokenizer has no"):
        FileSource(rows, plain, max_prompt_length=64, log=print)


def test_config_keys_of_the_file_task():
    with pytest.raises(ConfigError, match=r"task\.name=file needs data\.train_files="):
        load_config(["task=file"])
    with pytest.raises(ConfigError, match=r"are set but task\.name=addition does not read them"):
        load_config(["data.train_files=[a.parquet]"])
    with pytest.raises(ConfigError, match=r"known tasks: addition, file"):
        load_config(["task.name=nope"])
    with pytest.raises(ConfigError, match=r"data\.epochs must be >= 1, got 0"):
        load_config(["data.epochs=0"])
    cfg = load_config(["task=file", "data=verl", "data.train_files=[x.parquet]"])
    assert (cfg.data.answer_key, cfg.data.max_prompt_length) == ("reward_model.ground_truth", 512)
    assert set(TASKS) == {"addition", "file"}
