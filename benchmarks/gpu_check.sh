#!/usr/bin/env bash
# GPU checks of env.backend=native, in one call of under 5 minutes on a CUDA machine.
#
#   1. pytest -m gpu: native envs on cuda vs cpu (one step from 2000 states per env),
#      reproducibility on cuda, the collector's device path on cuda, a CUDA policy
#      over a host env, and `rlcollect run ... device=cuda:0` on both writers
#   2. frames/s: env + policy on the GPU (the ceiling), collected on the GPU and
#      copied to the host once per batch (SyncCollector, no writer), then the same
#      job written to memmap by the CLI: Pendulum, 65536 envs, MLP policy
#   3. wall time of the headline command
#      `rlcollect run env=Pendulum env.backend=native total_frames=1e6 device=cuda:0`
#
# Usage, from anywhere:  benchmarks/gpu_check.sh      (PYTHON=/path/to/python to choose one)
# Needs this checkout installed in that Python (pip install -e '.[dev]').
# Exit status: 0 all passed, 1 a step failed, 2 no CUDA device here.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python}
failed=()

step() {  # step NAME SECONDS COMMAND...: run with a time limit, remember failures
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    local start=$SECONDS
    if ! timeout "$limit" "$@"; then
        failed+=("$name")
    fi
    echo "   ($name: $((SECONDS - start)) s)"
}

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device visible to torch: nothing to check"
    exit 2
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null || true

step "pytest -m gpu" 90 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests
step "throughput: Pendulum, 65536 envs, mlp, cuda:0" 90 "$PY" benchmarks/native.py \
    --device cuda:0 --policy mlp --num-envs 65536 --frames-per-batch 3276800 \
    --quick-frames 1.3e7 --frames 2.6e7 --writer memmap --rows env,collector,cli
step "headline: total_frames=1e6 device=cuda:0" 110 "$PY" benchmarks/native.py \
    --device cuda:0 --rows headline

if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "all GPU checks passed"
