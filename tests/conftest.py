"""Shared fixtures, one home each. ``redis_server``: one private redis-server per test session
(``redis_client``: a client of it; ``buffer_name``: a fresh key prefix; ``redis_binary``: for
tests that start their own server);
``tiny_model``: a random 2-layer Qwen2 HF directory (vocab 32) for learner tests;
``roles``: processes a test starts, watched while it waits (tests/roles.py)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
import uuid

import pytest

# A fresh vLLM cache for every test session, in this process and every role a test starts:
# vLLM inspects a model class in a subprocess (reading the answer with pickle) only when its
# cache lacks the answer, so a cache warmed by earlier runs hid that path from the pickle
# guard. .ci/run also points the HF, XDG and torch caches at fresh directories.
_VLLM_CACHE = tempfile.mkdtemp(prefix="asyncrl-test-vllm-cache-")
os.environ["VLLM_CACHE_ROOT"] = _VLLM_CACHE
atexit.register(shutil.rmtree, _VLLM_CACHE, True)

# Ctrl-C must reach the processes tests start (tests/roles.py stops them with SIGINT) also when
# the test run itself was started in the background, which inherits SIGINT as ignored: an
# ignored signal stays ignored across exec, a handled one is reset to the default.
signal.signal(signal.SIGINT, signal.default_int_handler)

# A test run inside a Slurm job (srun pytest) must not hand that job's nodes, addresses and
# id to the commands its tests start (asyncrl/orchestration/slurm/); the Slurm tests pass
# their variables as a mapping.
os.environ["ASYNCRL_SLURM"] = "0"

# No pickle on our wires (asyncrl/core/net/wireguard.py): on in this process and, through the
# environment, in every role a test starts; a test that trips it fails (below).
os.environ.setdefault("ASYNCRL_FORBID_PICKLE", "1")
from asyncrl.core.net import wireguard  # noqa: E402  (after the env var: asyncrl/__init__ reads it)

wireguard.install_from_env()


@pytest.fixture(autouse=True)
def _no_pickle_on_our_wires():
    """Fail the test if our code unpickled anything (even if the error was caught)."""
    before = len(wireguard.violations())
    yield
    new = wireguard.violations()[before:]
    if new:
        pytest.fail("pickle used on asyncrl's wires:\n" + "\n".join(new), pytrace=False)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A started ``asyncrl.buffer.service.server.RedisServer`` (loopback, free port, password, AOF).

    Tests share it; give each test its own buffer name. Skips when redis-server is missing.
    """
    if shutil.which("redis-server") is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run Redis tests")
    from asyncrl.buffer.service.server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_binary() -> str:
    """Path of redis-server, for tests that start their own server; skips when missing."""
    path = shutil.which("redis-server")
    if path is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run Redis tests")
    return path


@pytest.fixture
def redis_client(redis_server):
    """A binary-safe client of the session's redis-server."""
    from asyncrl.buffer.connection import connect

    client = connect(redis_server.url, timeout_s=5.0)
    yield client
    client.close()


@pytest.fixture
def buffer_name() -> str:
    """A fresh key prefix, so tests sharing one server never see each other's data."""
    return f"test-{uuid.uuid4().hex[:12]}"


TINY_VOCAB = 32


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A random 2-layer Qwen2 model saved as an HF directory (read-only for tests)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)  # fmt: skip
    path = tmp_path_factory.mktemp("tiny_model")
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture
def roles(tmp_path):
    """``tests.roles.Roles`` logging to ``tmp_path/roles``; every process stopped at teardown."""
    from tests.roles import Roles

    with Roles(tmp_path / "roles") as r:
        yield r


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct as an HF directory (float32, tied embeddings), converted once into
    the repository's default ``model.cache_dir`` so that ``asyncrl run model=smollm2`` in e2e
    tests reuses it (~30 s the first time). Read-only for tests."""
    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.models.source import resolve_model_path

    model = load_config(["model=smollm2"]).model  # the GGUF file that `make setup` installs
    return str(resolve_model_path(model.path, model.cache_dir))


def pytest_configure(config):
    """Under xdist, keep the queue in collection order (``--no-loadscope-reorder``): the
    collection is ordered longest file first below (tests/schedule.py says why)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Longest file first (tests/schedule.py), on the controller and every worker alike."""
    from tests.schedule import load_costs, longest_first

    order = longest_first([item.nodeid for item in items], load_costs())
    items[:] = [items[i] for i in order]
