#!/usr/bin/env bash
# mypy strict over the `thunder_mw` package, scripts/ included (config in pyproject.toml),
# then strict over the tests. The package is this folder under another name, so mypy reads it
# through a link: .cache/typecheck/thunder_mw -> the repository root. The tests are checked as
# files, each module named as pytest imports it (tests/ and each test folder are import roots).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.cache/typecheck"
ln -sfn "$root" "$root/.cache/typecheck/thunder_mw"
cd "$root"
export MYPYPATH="$root/.cache/typecheck"
# Two runs, as mypy takes a package or files, not both; the second reuses the first's cache.
python3 -m mypy --config-file pyproject.toml -p thunder_mw "$@"
python3 -m mypy --config-file pyproject.toml --strict tests "$@"
