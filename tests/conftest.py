"""Fixtures shared by the whole test suite: the one real vLLM engine of a test run."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from asgi_servers import serving
from docker_fixtures import docker_client, sandbox  # noqa: F401  (fixtures for test_tools_*)
from fake_engine import FakeEngine
from real_vllm import RealVllm, missing_prerequisites, start_vllm

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
    ) as engine:
        yield engine


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    """An in-test engine on a loopback port that records what it received (its `url` set)."""
    fake = FakeEngine()
    with serving(fake) as server:
        fake.url = server.url  # type: ignore[attr-defined]
        yield fake


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that uses the real engine is a real_vllm test whether or not its author said so,
    # so `-m "not real_vllm"` always leaves the engine out.
    for item in items:
        if "vllm_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_vllm)
