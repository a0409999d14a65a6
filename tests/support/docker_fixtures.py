"""Fixtures for tests against the real Docker engine: the engine, and test containers that are
always removed (every one carries TEST_LABEL, so leftovers of a failed test are found too)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

IMAGE = os.environ.get("THUNDER_MW_SANDBOX_IMAGE", "thunder-mw/sandbox:test")
MANAGED = {"thunder-mw.managed": "true"}
TEST_LABEL = "thunder-mw.test"
REQUIRE_REAL_ENV = "THUNDER_MW_REQUIRE_REAL"


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_REAL_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_REAL_ENV}=1 forbids skipping)")
    pytest.skip(reason)


def remove_test_leftovers(client: docker.DockerClient) -> None:
    for c in client.containers.list(all=True, filters={"label": TEST_LABEL}):
        c.remove(force=True, v=True)
    for image in client.images.list(filters={"label": TEST_LABEL}):
        assert image.id is not None  # a listed image has one
        client.images.remove(image.id, force=True)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """A Docker SDK client of the real engine (scripts/setup_docker.sh starts one)."""
    try:
        import docker

        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:
        _unavailable(f"no Docker engine answers ({exc}); run scripts/setup_docker.sh")
    try:
        client.images.get(IMAGE)
    except Exception:
        _unavailable(f"image {IMAGE} is missing; run scripts/setup_docker.sh")
    yield client
    remove_test_leftovers(client)
    client.close()


@pytest.fixture
def sandbox(docker_client: docker.DockerClient) -> Iterator[Callable[..., Container]]:
    """Starts test containers (managed unless told otherwise); all are removed afterwards."""

    def start(managed: bool = True, image: str = IMAGE, **labels: str) -> Container:
        all_labels = {TEST_LABEL: "1", **(MANAGED if managed else {}), **labels}
        return docker_client.containers.run(
            image,
            ["sleep", "300"],
            detach=True,
            network_mode="none",
            labels=all_labels,
            name=f"tmw-test-{uuid.uuid4().hex[:10]}",
        )

    yield start
    remove_test_leftovers(docker_client)


def exists(client: docker.DockerClient, container_id: str | None) -> bool:
    # `str | None`: the Docker SDK types a container's id optional; a started one has one.
    assert container_id is not None
    import docker.errors

    try:
        client.containers.get(container_id)
    except docker.errors.NotFound:
        return False
    return True
