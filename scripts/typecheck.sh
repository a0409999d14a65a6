#!/usr/bin/env bash
# mypy over the `thunder_mw` package, scripts/ included (config in pyproject.toml: strict on
# every module; tests/ is left out until it is annotated). The package is this folder under
# another name, so mypy reads it through a link: .cache/typecheck/thunder_mw -> the repo root.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.cache/typecheck"
ln -sfn "$root" "$root/.cache/typecheck/thunder_mw"
cd "$root"
MYPYPATH="$root/.cache/typecheck" exec python3 -m mypy --config-file pyproject.toml -p thunder_mw "$@"
