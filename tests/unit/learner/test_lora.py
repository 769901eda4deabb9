"""``model.lora``: adapters added in place, only they train, and the merged weights that syncs
and exports send equal peft's own merge (asyncrl/learner/lora/)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.core.config.job import Config
from asyncrl.core.config.learner import LoraConfig, ModelConfig
from asyncrl.learner.compute.model import build_policy, full_named_tensors, load_hf_model
from asyncrl.learner.lora.adapters import adapted_layers, add_adapters, lora_scale
from asyncrl.learner.lora.merge import merge_weight, merged


def _cfg(**lora) -> Config:
    return Config(model=ModelConfig(lora=LoraConfig(**lora)))


def _tokens(n: int = 2, length: int = 7) -> torch.Tensor:
    return torch.randint(1, 32, (n, length), generator=torch.Generator().manual_seed(1))


def test_adapters_start_at_the_base_model_and_only_they_train(tiny_model):
    base = load_hf_model(tiny_model).eval()
    torch.manual_seed(0)
    model = build_policy(tiny_model, _cfg(rank=4, alpha=8.0)).eval()
    layers = adapted_layers(model)
    assert len(layers) == 2 * 7  # every linear projection of 2 decoder layers, not lm_head
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert lora_scale(model) == 2.0  # alpha / rank
    x = _tokens()
    torch.testing.assert_close(model(x).logits, base(x).logits)  # B = 0 at the start


def test_merged_weights_equal_peft_merge_under_the_base_names(tiny_model):
    torch.manual_seed(0)
    model = build_policy(tiny_model, _cfg(rank=4, alpha=16.0, targets=["q_proj", "up_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.1)  # a trained adapter
    ours = dict(full_named_tensors(model))
    assert set(ours) == set(load_hf_model(tiny_model).state_dict())
    x = _tokens()
    adapted = model.eval()(x).logits
    for _, layer in adapted_layers(model):
        layer.merge()  # peft's own merge, in place
    for name, tensor in model.state_dict().items():
        if ".lora_" not in name:
            torch.testing.assert_close(ours[name.replace(".base_layer.", ".")], tensor)
    plain = load_hf_model(tiny_model).eval()
    plain.load_state_dict(ours)
    torch.testing.assert_close(plain(x).logits, adapted, rtol=1e-4, atol=1e-5)


def test_an_optimizer_step_moves_only_the_adapters(tiny_model):
    torch.manual_seed(0)
    model = build_policy(tiny_model, _cfg(rank=2))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(_tokens()).logits.float().pow(2).mean().backward()
    opt.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(".lora_" in n for n in moved)  # the base weights are frozen
    assert len(opt.state) == sum(p.requires_grad for p in model.parameters())


def test_merge_weight_is_w_plus_scale_b_a():
    w, a, b = torch.ones(3, 2), torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0], [0.0], [2.0]])
    out = merge_weight(w, a, b, 0.5)
    assert torch.equal(out, torch.tensor([[1.5, 2.0], [1.0, 1.0], [2.0, 3.0]]))


def test_an_incomplete_adapter_is_an_error_not_a_silent_base_weight():
    named = [
        ("x.base_layer.weight", torch.zeros(2, 2)),
        ("x.lora_A.default.weight", torch.zeros(1, 2)),
    ]
    with pytest.raises(ValueError, match="without base weight or adapter: \\['x'\\]"):
        list(merged(named, 1.0))


def test_targets_that_match_nothing_or_no_linear_layer_name_the_key(tiny_model):
    with pytest.raises(
        ValueError, match=r"model.lora.targets=\['qproj'\] matches no linear.*q_proj"
    ):
        add_adapters(load_hf_model(tiny_model), LoraConfig(rank=2, targets=["qproj"]))
    with pytest.raises(ValueError, match="embed_tokens is not a linear layer"):
        add_adapters(load_hf_model(tiny_model), LoraConfig(rank=2, targets=["embed_tokens"]))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["model.lora.rank=-1"], "model.lora.rank must be >= 0"),
        (["model.lora.rank=8", "model.lora.alpha=0"], "model.lora.alpha must be > 0"),
        (["model.lora.dropout=1.0"], "model.lora.dropout must be >= 0 and < 1"),
        (["model.lora.targets=[]"], "model.lora.targets=\\[\\]"),
        (["model.lora.rank=8", "algorithm.advantage=gae"], "the critic has no LoRA adapters"),
        (["model.lora.sync=full"], "model.lora.sync='full': give one of adapter, merged"),
        (["model.lora.rank=1024"], "vLLM serves adapters of rank <= 512"),
    ],
)
def test_bad_lora_settings_are_refused_naming_the_key(overrides, match):
    from asyncrl.core.config.load import load_config

    with pytest.raises(ValueError, match=match):
        load_config(overrides)


def test_the_peft_export_loads_in_peft_as_the_adapted_model(tiny_model, tmp_path):
    from peft import PeftModel

    from asyncrl.learner.lora.peft_export import lora_config_of
    from asyncrl.learner.state.checkpoint import export_adapter

    torch.manual_seed(0)
    model = build_policy(tiny_model, _cfg(rank=4, alpha=8.0, targets=["k_proj", "gate_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.1)
    assert lora_config_of(model) == LoraConfig(rank=4, alpha=8.0, targets=["gate_proj", "k_proj"])
    assert export_adapter(model, tmp_path / "adapter", tiny_model)
    loaded = PeftModel.from_pretrained(load_hf_model(tiny_model), str(tmp_path / "adapter"))
    x = _tokens()
    torch.testing.assert_close(loaded.eval()(x).logits, model.eval()(x).logits)
    assert not export_adapter(load_hf_model(tiny_model), tmp_path / "none", tiny_model)


@pytest.mark.parametrize("variant", ["gradient_checkpointing", "packed"])
def test_adapters_train_the_same_with_gradient_checkpointing_and_packing(tiny_model, variant):
    """The adapters' log-probs and gradients under ``model.gradient_checkpointing`` (peft's
    layers recomputed in backward) and on packed rows equal the plain padded step's."""
    from asyncrl.learner.compute.model import token_logprobs

    torch.set_num_threads(1)
    ids = _tokens(3, 9)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # a shorter row: packing puts it beside the others

    def grads(model):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".lora_B." in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))
        lp, _ = token_logprobs(model, ids, mask)
        model.zero_grad(set_to_none=True)
        (lp * mask[:, 1:]).sum().backward()
        got = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return lp.detach() * mask[:, 1:], got

    plain = build_policy(tiny_model, _cfg(rank=4, alpha=8.0))
    cfg = _cfg(rank=4, alpha=8.0)
    cfg.model.gradient_checkpointing = variant == "gradient_checkpointing"
    other = build_policy(tiny_model, cfg, packed=variant == "packed")
    want_lp, want = grads(plain)
    lp, got = grads(other)
    torch.testing.assert_close(lp, want_lp, rtol=1e-5, atol=1e-6)
    assert set(got) == set(want) and any(g.abs().max() > 0 for g in want.values())
    for name, g in want.items():  # float32: packed attention rounds otherwise (~2e-6)
        assert torch.allclose(got[name], g, rtol=1e-4, atol=1e-5), (
            name,
            (got[name] - g).abs().max(),
        )


def test_a_merged_sync_sends_the_whole_model_an_adapter_sync_the_adapters(tiny_model):
    from asyncrl.learner.compute.model import sync_tensors
    from asyncrl.learner.lora.peft_export import PEFT_PREFIX

    base = set(load_hf_model(tiny_model).state_dict())
    merged_policy = build_policy(tiny_model, _cfg(rank=4, sync="merged"))
    assert {n for n, _ in sync_tensors(merged_policy)} == base  # under the base model's names
    sent = {n for n, _ in sync_tensors(build_policy(tiny_model, _cfg(rank=4)))}
    assert sent and all(n.startswith(PEFT_PREFIX) and ".lora_" in n for n in sent)
    assert len(sent) == 2 * 2 * 7  # A and B of 7 projections in 2 layers
