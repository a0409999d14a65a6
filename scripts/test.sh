#!/usr/bin/env bash
# Runs all of the project's checks, from a fresh machine: install, real engines, lint, tests.
# Usage: scripts/test.sh [--fast] [PYTEST_ARGS...]   (other arguments go to pytest unchanged)
#
#   scripts/test.sh          what CI runs (.ci/run): sets up the real vLLM engine, Docker and
#                            Chromium, runs ruff, the bare-install check
#                            (scripts/check_bare_install.py), every test, then the conformance
#                            suite against thunder-mw itself.
#   scripts/test.sh --fast   the lane for work in progress (about a minute on 2 cores,
#                            the tests ~52 s on 4 xdist workers; `-n N` after --fast
#                            overrides): no
#                            engine, Docker or browser setup and no conformance run; ruff,
#                            then pytest -m "not slow and not real_vllm and not docker and
#                            not browser and not peers and not redis" (the in-process tests).
#                            tests/conftest.py says how the markers are set.
set -euo pipefail
cd "$(dirname "$0")/.."

fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi
FAST_MARKERS="not slow and not real_vllm and not docker and not browser and not peers and not redis"

# The editable install is redone only when pyproject.toml, the compiled part
# (sim/_kvblocks.c: a stale build would run old C) or the interpreter changed, or when
# `thunder_mw` resolves to another checkout.
stamp=.cache/editable-install.stamp
want="$(python3 --version 2>&1) $(cat pyproject.toml sim/_kvblocks.c | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! python3 -c \
  'import os, sys, thunder_mw; sys.exit(os.path.dirname(thunder_mw.__file__) != os.getcwd())' \
  2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check -e '.[test,bench,peers,agents]'
  mkdir -p .cache && echo "$want" >"$stamp"
fi

if [ "$fast" -eq 0 ]; then
  # The real vLLM engine is heavy (~3.4 GB, cached under .cache/). Where it cannot be set up,
  # its tests skip, unless THUNDER_MW_REQUIRE_REAL=1 (CI), which makes that a failure.
  if ! bash scripts/setup_real_engines.sh; then
    if [ "${THUNDER_MW_REQUIRE_REAL:-0}" = "1" ]; then
      echo "test.sh: real engine setup failed and THUNDER_MW_REQUIRE_REAL=1" >&2
      exit 1
    fi
    echo "test.sh: real engine setup failed; its tests will be skipped" >&2
  fi
  # The real Docker engine (installed and started as root where it is missing) for the tool
  # manager's tests; same rule: a failure is fatal only under THUNDER_MW_REQUIRE_REAL=1.
  if ! bash scripts/setup_docker.sh; then
    if [ "${THUNDER_MW_REQUIRE_REAL:-0}" = "1" ]; then
      echo "test.sh: Docker engine setup failed and THUNDER_MW_REQUIRE_REAL=1" >&2
      exit 1
    fi
    echo "test.sh: Docker engine setup failed; the Docker tool tests will be skipped" >&2
  fi

  # The real redis-server and nginx for the replica tests (tests/real/test_replicas.py); same rule.
  if ! bash scripts/setup_redis_nginx.sh; then
    if [ "${THUNDER_MW_REQUIRE_REAL:-0}" = "1" ]; then
      echo "test.sh: redis-server / nginx setup failed and THUNDER_MW_REQUIRE_REAL=1" >&2
      exit 1
    fi
    echo "test.sh: redis-server / nginx setup failed; the replica tests will be skipped" >&2
  fi

  # Headless Chromium for the dashboard's browser test; same rule.
  if ! bash scripts/setup_chromium.sh; then
    if [ "${THUNDER_MW_REQUIRE_REAL:-0}" = "1" ]; then
      echo "test.sh: Chromium setup failed and THUNDER_MW_REQUIRE_REAL=1" >&2
      exit 1
    fi
    echo "test.sh: Chromium setup failed; the dashboard browser test will be skipped" >&2
  fi
fi

python3 -m ruff check .
python3 -m ruff format --check .
bash scripts/typecheck.sh

# A fresh install as a newcomer makes it: the wheel in a bare venv with no extras, every
# subcommand's --help, and the README's demo answering one chat request (~40 s).
if [ "$fast" -eq 0 ]; then
  python3 scripts/check_bare_install.py
fi

status=0
if [ "$fast" -eq 1 ]; then
  # Four workers on two cores: the in-process tests mostly wait on timeouts (CPU ~45 s of the
  # ~125 s serial run), so they overlap; -p no:benchmark keeps a stray pytest-benchmark's
  # "disabled under xdist" warning from failing the run (warnings are errors here).
  python3 -m pytest -m "$FAST_MARKERS" -n 4 -p no:benchmark "$@" || status=$?
else
  python3 -m pytest "$@" || status=$?
fi
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure, not a pass" >&2
  exit 1
fi
if [ "$status" -ne 0 ]; then
  exit "$status"
fi

# The conformance suite, as a user runs it, against thunder-mw itself.
if [ "$fast" -eq 0 ]; then
  python3 -m thunder_mw.cli.main conformance --self --profile full
fi
