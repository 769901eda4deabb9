"""The data identity check at actor start (actors/data/identity.py) against a real redis-server,
as the actor ACL user: the first actor records it, a restart with the same data passes, one
with other data or another stride is refused naming what changed; ``claim_meta`` gives the
field to exactly one of many racing callers."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from asyncrl.actors.data import identity as data_identity
from asyncrl.actors.data.tasks import build_prompt_source
from asyncrl.buffer.connection import connect
from asyncrl.buffer.redis_buffer import ReplayBuffer
from asyncrl.core.config.load import load_config
from asyncrl.core.runtime.fatal import FatalError
from asyncrl.orchestration.demo.tokenizer import save_tokenizer

pytestmark = pytest.mark.redis


@pytest.fixture
def actor_buffer(redis_server, buffer_name):
    """``() -> ReplayBuffer`` as an actor process opens it (its own connection, actor user)."""
    clients = []

    def open_buffer() -> ReplayBuffer:
        clients.append(connect(redis_server.url_for("actor"), timeout_s=5.0))
        return ReplayBuffer(clients[-1], buffer_name, capacity=8)

    yield open_buffer
    for c in clients:
        c.close()


def test_an_actor_start_with_other_data_is_refused_and_with_the_same_passes(tmp_path, actor_buffer):
    model_dir = tmp_path / "model"
    save_tokenizer(model_dir)
    (model_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                            for i in range(5)))  # fmt: skip

    def start(*overrides) -> bool:
        """What actors/main.py run() does before starting its engine."""
        cfg = load_config(["task=file", f"data.train_files=[{data}]", "actor.num_actors=2",
                           "data.epochs=1", *overrides])  # fmt: skip
        source = build_prompt_source(cfg, str(model_dir), lambda _: None)
        return data_identity.check(actor_buffer(), data_identity.identity(cfg, source))

    assert start() is True  # the first actor records it
    assert start() is False  # a restart: the same data and settings
    assert start("data.epochs=3") is False  # a resume given more epochs
    with pytest.raises(FatalError) as e:
        start("actor.num_actors=3")
    assert ": actor.num_actors was 2, now 3. " in str(e.value)
    data.write_text(data.read_text().replace("4+1=", "4+2="))  # the file edited in place
    with pytest.raises(FatalError) as e:
        start()
    assert "the content of data.train_files changed" in str(e.value)
    assert "Use a new run_dir / buffer.name for a new run" in str(e.value)


def test_claim_meta_gives_the_field_to_exactly_one_racing_caller(actor_buffer):
    buffers = [actor_buffer() for _ in range(8)]
    with ThreadPoolExecutor(len(buffers)) as pool:
        got = list(pool.map(lambda i: buffers[i].claim_meta("k", f"v{i}"), range(len(buffers))))
    winners = [i for i, old in enumerate(got) if old is None]
    assert len(winners) == 1
    assert {old for old in got if old is not None} == {f"v{winners[0]}"}
    assert buffers[0].meta()["k"] == f"v{winners[0]}"
    with pytest.raises(ValueError, match="'capacity' is managed by ReplayBuffer"):
        buffers[0].claim_meta("capacity", "1")
