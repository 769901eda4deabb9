"""The data identity of a buffer's prompt cursors (actors/data/identity.py): the same data and
settings give the same fingerprint, each part that changes the index -> prompt mapping or the
actors' stride gives another one and is named in the message, ``data.epochs`` is not a part
(more epochs keep every existing index's prompt), and ``check`` claims once, then compares.
The real-Redis side: tests/integration/test_data_identity_redis.py."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from asyncrl.actors.data import identity as data_identity
from asyncrl.actors.data.tasks import build_prompt_source
from asyncrl.core.config.load import load_config
from asyncrl.core.runtime.fatal import FatalError
from asyncrl.orchestration.demo.tokenizer import save_tokenizer

ROWS = [{"prompt": f"{'1' * (i + 1)}+1=", "alt": f"{i}+2=", "answer": str(i)} for i in range(6)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo_tok")
    save_tokenizer(path)
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    return str(path)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "t.jinja").write_text("solve: {{ content }}")
    return path


def parts(model_dir, data, *overrides, files=None):
    cfg = load_config(["task=file", f"data.train_files=[{files or data}]", "experiment=tiny",
                       "actor.num_actors=2", "task.seed=1", *overrides])  # fmt: skip
    return data_identity.identity(cfg, build_prompt_source(cfg, model_dir, lambda _: None))


def test_the_same_data_and_settings_give_the_same_fingerprint(model_dir, data, tmp_path):
    a = parts(model_dir, data)
    moved = tmp_path / "elsewhere.jsonl"  # the same bytes under another path: the same data
    shutil.copy(data, moved)
    assert a == parts(model_dir, data) == parts(model_dir, data, files=moved)
    assert re.fullmatch(r"[0-9a-f]{16}", data_identity.fingerprint(a))
    assert data_identity.fingerprint(a) == data_identity.fingerprint(dict(reversed(a.items())))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("task.seed=2", "task.seed was 1, now 2"),
        ("actor.num_actors=3", "actor.num_actors was 2, now 3"),
        ("data.shuffle=false", "data.shuffle was true, now false"),
        ("data.prompt_key=alt", 'data.prompt_key was "prompt", now "alt"'),
        ("data.answer_key=alt", 'data.answer_key was "answer", now "alt"'),
        ("data.extra_info_key=alt", 'data.extra_info_key was "", now "alt"'),
        ("data.max_prompt_length=6", "data.max_prompt_length was 64, now 6; the prompts kept by "
         "the length filter changed (were 6, now 3: data.max_prompt_length or the model's "
         "tokenizer changed)"),
        ("data.prompt_template={dir}/t.jinja", "data.prompt_template was \"\", now \"sha256:"),
    ],
)  # fmt: skip
def test_each_part_changes_the_fingerprint_and_is_named(model_dir, data, override, message):
    before = parts(model_dir, data)
    after = parts(model_dir, data, override.format(dir=data.parent))
    assert data_identity.fingerprint(before) != data_identity.fingerprint(after)
    assert message in "; ".join(data_identity.differences(before, after))


def test_changed_file_content_and_template_content_are_named(model_dir, data):
    template = f"data.prompt_template={data.parent}/t.jinja"
    before = parts(model_dir, data, template)
    (data.parent / "t.jinja").write_text("answer: {{ content }}")
    with data.open("a") as f:
        f.write(json.dumps({"prompt": "9+9=", "alt": "", "answer": "18"}) + "\n")
    changes = data_identity.differences(before, parts(model_dir, data, template))
    assert changes == [
        "the content of data.prompt_template changed",
        "the content of data.train_files changed",
        "the prompts kept by the length filter changed (were 6, now 7: data.max_prompt_length "
        "or the model's tokenizer changed)",
    ]


def test_more_epochs_keep_every_prompt_and_the_fingerprint(model_dir, data):
    cfgs = [load_config(["task=file", f"data.train_files=[{data}]", "experiment=tiny",
                         f"data.epochs={e}"]) for e in (2, 3)]  # fmt: skip
    two, three = (build_prompt_source(c, model_dir, lambda _: None) for c in cfgs)
    assert [two.get(i).text for i in range(two.end)] == [three.get(i).text for i in range(two.end)]
    assert data_identity.identity(cfgs[0], two) == data_identity.identity(cfgs[1], three)


def test_the_addition_task_is_identified_by_its_seed_and_parameters():
    def of(*overrides):
        cfg = load_config(["task.seed=3", *overrides])
        return data_identity.identity(cfg, build_prompt_source(cfg, "", lambda _: None))

    assert of() == of() and of()["addition.digit_weights"] == [0.4, 0.35, 0.15, 0.07, 0.03]
    assert data_identity.differences(of(), of("task.seed=4")) == ["task.seed was 3, now 4"]


class FakeMeta:
    """A buffer's meta hash with ``ReplayBuffer.claim_meta``'s contract."""

    name = "buf"

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}

    def claim_meta(self, key: str, value: str) -> str | None:
        old = self.fields.get(key)
        self.fields.setdefault(key, value)
        return old


def test_check_claims_once_then_compares(model_dir, data):
    buf, said = FakeMeta(), []
    first = parts(model_dir, data)
    assert data_identity.check(buf, first, said.append) is True
    assert data_identity.check(buf, parts(model_dir, data, "data.epochs=5"), said.append) is False
    fp = data_identity.fingerprint(first)
    assert said == [f"data identity {fp} recorded in buffer 'buf'",
                    f"data identity {fp} matches buffer 'buf'"]  # fmt: skip
    with pytest.raises(FatalError) as e:
        data_identity.check(buf, parts(model_dir, data, "actor.num_actors=4", "data.shuffle=false"))
    assert str(e.value).startswith(
        "the prompt data differs from what buffer 'buf' was started with: actor.num_actors was "
        "2, now 4; data.shuffle was true, now false. "
    )
    assert "Use a new run_dir / buffer.name for a new run, or restore the original" in str(e.value)
    buf.fields[data_identity.META_KEY] = "garbage"
    with pytest.raises(FatalError, match=r"holds 'garbage', not a data identity this version"):
        data_identity.check(buf, first)
