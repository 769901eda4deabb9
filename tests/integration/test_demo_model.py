"""The demo model directory: loads with transformers, tokenizer round-trips, seeded weights.

vLLM loading is checked by ``python scripts/check_vllm.py`` (it starts an engine, ~30 s).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from asyncrl.orchestration.demo.model import VOCAB_SIZE, build_demo_model  # noqa: E402
from asyncrl.orchestration.demo.tokenizer import ALPHABET  # noqa: E402

SMALL = dict(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return build_demo_model(tmp_path_factory.mktemp("demo") / "m", seed=0, **SMALL)


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_directory_loads_with_transformers(model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.dtype == torch.float32
    assert model.config.vocab_size == VOCAB_SIZE
    logits = model(torch.tensor([[4, 5, 14, 6, 18]])).logits
    assert logits.shape == (1, 5, VOCAB_SIZE)
    gen = transformers.GenerationConfig.from_pretrained(model_dir)
    assert gen.eos_token_id == model.config.eos_token_id == 1


@pytest.mark.parametrize("text", ["12+345=357", " a  b\n\n", ALPHABET, "what is (3*4)-1? 11."])
def test_tokenizer_round_trip(model_dir, text):
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    ids = tok.encode(text)
    assert len(ids) == len(text)  # one token per character, no BOS added
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text
    assert "".join(tok.decode([i]) for i in ids) == text  # token by token, as vLLM decodes
    assert len(tok) == VOCAB_SIZE
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)


def test_weights_are_deterministic_per_seed(model_dir, tmp_path):
    same = _weights(build_demo_model(tmp_path / "again", seed=0, **SMALL))
    other = _weights(build_demo_model(tmp_path / "other", seed=1, **SMALL))
    ref = _weights(model_dir)
    assert same.keys() == ref.keys()
    assert all(torch.equal(same[k], ref[k]) for k in ref)
    assert any(not torch.equal(other[k], ref[k]) for k in ref)


def test_warm_start_is_cached_by_its_arguments(tmp_path):
    from asyncrl.orchestration.demo.warmstart import prepare_demo_model

    lines: list[str] = []
    kw = dict(sft_steps=2, batch_size=4, num_layers=1, hidden_size=32, log_every=1)
    first = prepare_demo_model(tmp_path, seed=0, log=lines.append, **kw)
    assert (first / "model.safetensors").is_file() and (first / "warmstart.json").is_file()
    assert any("sft step 2/2" in line for line in lines)
    lines.clear()
    assert prepare_demo_model(tmp_path, seed=0, log=lines.append, **kw) == first
    assert lines == []  # cache hit: nothing trained, nothing logged
    assert prepare_demo_model(tmp_path, seed=1, log=lines.append, **kw) != first
    assert not list(tmp_path.glob(".tmp-demo-*"))  # temp dirs renamed or removed
    transformers.AutoModelForCausalLM.from_pretrained(first)


def test_a_build_waits_for_another_process_building_the_same_model_and_reuses_it(tmp_path):
    """A launch that finds the same warm start being built waits, saying so, and reuses what
    the builder wrote instead of training it again (four parallel Slurm launches once each
    built it)."""
    import fcntl
    import shutil
    import threading

    from asyncrl.orchestration.demo.warmstart import prepare_demo_model

    kw = dict(sft_steps=2, batch_size=4, num_layers=1, hidden_size=32, log_every=1)
    built = prepare_demo_model(tmp_path / "elsewhere", seed=0, log=lambda _: None, **kw)
    cache, lines, result = tmp_path / "cache", [], []
    cache.mkdir()
    holder = (cache / f"{built.name}.lock").open("w")
    fcntl.flock(holder, fcntl.LOCK_EX)  # "another process" is building it
    thread = threading.Thread(
        target=lambda: result.append(prepare_demo_model(cache, seed=0, log=lines.append, **kw))
    )
    thread.start()
    thread.join(1.0)
    assert thread.is_alive() and "another process building the demo model" in lines[0]
    shutil.copytree(built, cache / built.name)  # the builder's rename
    holder.close()
    thread.join(30)
    assert result == [cache / built.name]
    assert not any("building demo model" in line for line in lines), lines
