"""Fixtures shared by the whole test suite, and the markers that pick its fast lane.

Layout (tests/README.md says why): `unit/` pure, no sockets; `live/` the gateway with
in-process or simulated engines over loopback; `real/` real engines, Docker, Chromium,
Redis/nginx, peers and agents; `sim/` the simulator's own; `support/` the helpers, imported
by name (`from support.polling import wait_until`). This file's folder is on sys.path, so
`support` resolves from every group. The markers below, not the folders, pick the lanes.

Running the tests
-----------------
- `bash scripts/test.sh` is what CI runs (.ci/run): it sets up the real vLLM engine, Docker
  and Chromium, runs ruff, then every test and the conformance suite. Use it before pushing.
- `bash scripts/test.sh --fast` is the lane for a change in progress: no engine, Docker or
  browser setup; ruff, then the in-process tests (`-m "not slow and not real_vllm and not
  docker and not browser and not peers and not redis"`), in about 2.5 minutes on 2 cores
  (the tests themselves under 2).
  Extra arguments go to pytest.
- The same selection by hand: `python3 -m pytest -m "not slow and not real_vllm and not
  docker and not browser and not peers and not redis"`.

Markers (pyproject.toml lists them)
-----------------------------------
- `real_vllm`, `docker`, `browser`: set here, from the fixture a test uses (`vllm_engine`;
  `docker_client` or `sandbox`; `browser`), so a new test gets its marker without asking.
- `peers`: set by hand on the modules that run the real peer routers (vllm-router, smg).
- `redis`: set by hand on the modules that run the real redis-server and nginx (gateway
  replicas; scripts/setup_redis_nginx.sh installs them).
- `slow`: set by hand (`pytestmark = pytest.mark.slow` or on the test) on a test that starts
  `thunder-mw serve` or `sim-engine` processes, runs schemathesis, or takes over ~2 s. Measure
  with `--durations=30` and move a slow test out of the fast lane rather than shrinking it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from support.asgi_servers import serving
from support.docker_fixtures import docker_client, sandbox  # noqa: F401  (fixtures for test_tools_*)
from support.fake_engine import FakeEngine
from support.real_vllm import RealVllm, missing_prerequisites, start_vllm

# Set by .ci/run: there a missing real engine is a failure, never a silent skip.
REQUIRE_REAL_ENV = "THUNDER_MW_REQUIRE_REAL"
# Loaded 2-core machines have been seen taking ~100 s to start the engine.
ENGINE_STARTUP_TIMEOUT_S = 240.0


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_REAL_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_REAL_ENV}=1 forbids skipping)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    """One real vLLM CPU engine (tiny model, 24 KV blocks of 128 tokens) for the whole run."""
    reason = missing_prerequisites()
    if reason:
        _unavailable(reason)
    with start_vllm(
        num_blocks=24,
        log_dir=tmp_path_factory.mktemp("vllm"),
        startup_timeout_s=ENGINE_STARTUP_TIMEOUT_S,
        log_requests=True,  # test_sim_validation waits for its overflow to reach the engine
    ) as engine:
        yield engine


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    """An in-test engine on a loopback port that records what it received (its `url` set)."""
    fake = FakeEngine()
    with serving(fake) as server:
        fake.url = server.url
        yield fake


# A test is marked by what its fixtures (direct or through other fixtures) need, whether or
# not its author said so: `-m "not real_vllm"` always leaves the engine out, and so on.
MARKER_BY_FIXTURE = {
    "vllm_engine": "real_vllm",
    "docker_client": "docker",
    "browser": "browser",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for fixture, marker in MARKER_BY_FIXTURE.items():
            if fixture in fixtures:
                item.add_marker(marker)
