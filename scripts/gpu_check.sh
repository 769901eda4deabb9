#!/usr/bin/env bash
# The prepared GPU check (scripts/gpu_check.py): at most 8 minutes on a bare GPU machine
# (torch with CUDA and transformers, nothing else of ours, no network); results in
# benchmarks/results/gpu/.
#
#   bash scripts/gpu_check.sh --fetch-wheels   # here, with network: the small wheels the check
#                                              # needs (hydra-core, omegaconf, antlr4, xxhash;
#                                              # under 1 MiB) into .whl/ for Python 3.12, x86-64
#   bash scripts/gpu_check.sh                  # there: installs .whl/*.whl (if any) into a
#                                              # temporary target, then runs the check
#   bash scripts/gpu_check.sh --dry-run        # anywhere: the plumbing on a CPU, tiny shapes
#
# Other arguments go to scripts/gpu_check.py (--help lists them). ASYNCRL_COMMIT names the
# commit in the results where the checkout has no .git (a copied working tree).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && ! "$PY" -c 'import torch' 2>/dev/null && PY=.venv/bin/python

# peft (model.lora, the lora16 arm) and what it needs beyond torch and transformers
WHEELS=(hydra-core==1.3.8 omegaconf==2.3.1 xxhash==4.1.0 peft==0.21.2 accelerate==1.16.0 psutil==7.1.1)
if [ "${1:-}" = "--fetch-wheels" ]; then
    mkdir -p .whl
    plat=()
    for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do plat+=(--platform "$p"); done
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${plat[@]}" -d .whl "${WHEELS[@]}"
    # antlr4-python3-runtime 4.9.3 (hydra's pin) is published as source only: build its
    # pure-Python wheel here
    "$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
    du -sh .whl
    exit 0
fi

missing=$("$PY" - <<'PY'
import importlib.util
print(" ".join(m for m in ("hydra", "omegaconf", "xxhash") if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "gpu_check: missing $missing and no wheels in .whl/; run 'bash scripts/gpu_check.sh --fetch-wheels' where there is network" >&2
        exit 2
    fi
    site=$(mktemp -d /tmp/gpu-check-site.XXXXXX)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: installed $(ls .whl | tr '\n' ' ')into $site"
fi
export ASYNCRL_COMMIT=${ASYNCRL_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
exec "$PY" scripts/gpu_check.py "$@"
