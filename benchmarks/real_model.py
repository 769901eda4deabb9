"""A real (pretrained) model in the benchmarks: ``--model SPEC`` as config overrides, its
local directory, its parameter counts, and prompts a chat model is trained on.

``SPEC`` is a model preset (a file in ``configs/model/``: ``demo``, ``smollm2``) or anything
``model.path`` takes (``asyncrl/orchestration/models/source.py``: a directory, a GGUF file,
``package:NAME/FILE.gguf``, a Hub id), which then runs under ``model=local``. The demo's
addition prompts mean nothing to a chat model, so for any other model the benchmarks give the
actor ``examples/smollm2_math``'s word problems as a ``task=file data=verl`` parquet file:
real prompts under the model's own chat template (59-64 tokens with SmolLM2's), scored by the
built-in math-verify reward, as ``asyncrl run`` would.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from asyncrl.core.config.load import CONFIG_DIR
from benchmarks.common import REPO

MATH_EXAMPLE = REPO / "examples" / "smollm2_math" / "make_data.py"


def model_overrides(spec: str | None) -> list[str]:
    """``asyncrl`` overrides selecting ``spec`` (none for None: the config's own model)."""
    if spec is None:
        return []
    if (CONFIG_DIR / "model" / f"{spec}.yaml").is_file():
        return [f"model={spec}"]
    return ["model=local", f"model.path={spec}"]


def is_demo(cfg) -> bool:
    return cfg.model.path == "demo"


def resolve_model_dir(spec: str | None, extra: list[str] = ()) -> tuple[object, str]:
    """``(config, local model directory)`` of ``spec`` plus ``extra`` overrides, resolved as a
    run resolves ``model.path`` (``asyncrl.orchestration.launch.preflight.resolve_model``: the demo built,
    a GGUF file converted once into ``model.cache_dir``)."""
    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.launch.preflight import resolve_model

    cfg = load_config(["metrics_port=0", *model_overrides(spec), *extra])
    return cfg, resolve_model(cfg)


def math_task(out_dir: Path, count: int, seed: int = 0) -> list[str]:
    """Write ``count`` of ``examples/smollm2_math``'s problems to ``out_dir/train.parquet``;
    the overrides that make them the actor's prompts (``task=file data=verl``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    spec = importlib.util.spec_from_file_location("smollm2_math_data", MATH_EXAMPLE)
    make_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_data)
    path = Path(out_dir) / "train.parquet"
    pq.write_table(pa.Table.from_pylist(make_data.records(count, seed)), path)
    return ["task=file", "data=verl", f"data.train_files=[{path}]"]


def param_counts(model_dir: str | Path) -> dict:
    """Parameter counts of the model in ``model_dir`` (built on the meta device: nothing
    loaded), as ``benchmarks.learner.throughput_model.build_model_dir`` reports a random model's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())  # a tied head is one parameter
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = head is embed
    return {"n_params": params, "n_params_embedding": embed.numel(), "tied_head": tied,
            "n_params_non_embedding": params - embed.numel() - (0 if tied else head.numel())}  # fmt: skip
