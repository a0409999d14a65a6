#!/usr/bin/env bash
# mypy over the `thunder_mw` package (config in pyproject.toml: strict on policies/, schemas/
# and engines/, default elsewhere). The package is this folder under another name, so mypy
# reads it through a link: .cache/typecheck/thunder_mw -> the repository root.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.cache/typecheck"
ln -sfn "$root" "$root/.cache/typecheck/thunder_mw"
cd "$root"
MYPYPATH="$root/.cache/typecheck" exec python3 -m mypy --config-file pyproject.toml -p thunder_mw "$@"
