"""The Docker tool manager against a real engine: adoption, refusal, reclaim, warm pool."""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import docker
import httpx
from docker.models.containers import Container
from support import tool_hooks
from support.asgi_servers import ServerThread
from support.docker_fixtures import IMAGE, TEST_LABEL, exists
from support.fake_engine import FakeEngine
from support.polling import wait_until

from thunder_mw.middleware.app import ThunderGateway, create_app
from thunder_mw.schemas.config import ThunderConfig
from thunder_mw.tools.docker_tools import DockerTools

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class ToolsServer(ServerThread):
    """A served gateway and its Docker tool manager."""

    def __init__(self, app: ThunderGateway) -> None:
        super().__init__(app)
        assert app.core.tools is not None  # the gateway below never disables them
        self.tools: DockerTools = app.core.tools


class HasUrl(Protocol):
    url: str


@contextmanager
def gateway(
    engine: FakeEngine,
    tmp_path: Path,
    policies: list[dict[str, Any]] | None = None,
    server: dict[str, Any] | None = None,
    **docker_settings: Any,
) -> Iterator[ToolsServer]:
    settings = {
        "enabled": True,
        "journal_path": str(tmp_path / "journal.sqlite3"),
        "stop_timeout_s": 0,
        "sweep_interval_s": 0.1,
        **docker_settings,
    }
    extra: dict[str, Any] = {} if policies is None else {"policies": policies}
    config = ThunderConfig(
        backends=[{"name": "e0", "url": engine.url}],
        tools={"docker": settings},
        server=server or {},
        **extra,
    )
    gw = ToolsServer(create_app(config)).start()
    try:
        yield gw
    finally:
        gw.stop()


def step(
    gw: HasUrl, program_id: str, docker_ids: list[str | None], **headers: str
) -> httpx.Response:
    # `list[str | None]`: the Docker SDK types a container's id as optional.
    body = {**CHAT, "program_id": program_id, "docker_ids": docker_ids}
    return httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def release(gw: HasUrl, program_id: str) -> httpx.Response:
    return httpx.post(f"{gw.url}/programs/release", json={"program_id": program_id}, timeout=30)


def error(r: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = r.json()["error"]
    return body


# ------------------------------------------------------------------ adopt and reclaim
def test_adopted_container_is_listed_and_removed_on_release(
    engine: FakeEngine,
    tmp_path: Path,
    sandbox: Callable[..., Container],
    docker_client: docker.DockerClient,
) -> None:
    box = sandbox()
    with gateway(engine, tmp_path) as gw:
        assert step(gw, "p1", [box.id]).status_code == 200
        listed = httpx.get(f"{gw.url}/programs/p1").json()["containers"]
        assert [c["id"] for c in listed] == [box.id] and listed[0]["state"] == "owned"
        assert release(gw, "p1").json() == {"program_id": "p1", "released": True}
        assert wait_until(lambda: not exists(docker_client, box.id), 30)


def test_adoption_is_idempotent_across_a_programs_requests(
    engine: FakeEngine, tmp_path: Path, sandbox: Callable[..., Container]
) -> None:
    box = sandbox()
    with gateway(engine, tmp_path) as gw:
        for _ in range(3):
            assert step(gw, "p1", [box.name]).status_code == 200
        assert step(gw, "p1", [box.id]).status_code == 200
        assert len(httpx.get(f"{gw.url}/programs/p1").json()["containers"]) == 1


def test_release_removes_the_image_once_no_container_uses_it(
    engine: FakeEngine,
    tmp_path: Path,
    sandbox: Callable[..., Container],
    docker_client: docker.DockerClient,
) -> None:
    tag = f"thunder-mw/sandbox:gc-{uuid.uuid4().hex[:8]}"
    dockerfile = f"FROM {IMAGE}\nLABEL {TEST_LABEL}=1 run={tag}\n".encode()
    docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True)
    box = sandbox(image=tag)
    with gateway(engine, tmp_path, remove_images=True) as gw:
        assert step(gw, "p1", [box.id]).status_code == 200
        release(gw, "p1")
        assert wait_until(lambda: not docker_client.images.list(filters={"reference": tag}), 30)
    assert docker_client.images.get(IMAGE)  # the base image other tests use is untouched


def test_trajectory_final_reclaims_the_programs_containers(
    engine: FakeEngine,
    tmp_path: Path,
    sandbox: Callable[..., Container],
    docker_client: docker.DockerClient,
) -> None:
    box = sandbox()
    with gateway(engine, tmp_path) as gw:
        r = step(gw, "p1", [box.id], **{"X-Dynamo-Session-Final": "true"})
        assert r.status_code == 200
        assert wait_until(lambda: not exists(docker_client, box.id), 30)


def test_idle_expiry_reclaims_the_programs_containers(
    engine: FakeEngine,
    tmp_path: Path,
    sandbox: Callable[..., Container],
    docker_client: docker.DockerClient,
) -> None:
    box = sandbox()
    policies = [{"gc_hooks": {"idle_ttl_s": 0.3, "reclaim": ["stop", "remove"]}}]
    with gateway(engine, tmp_path, policies, server={"tick_interval_s": 0.05}) as gw:
        assert step(gw, "p1", [box.id]).status_code == 200
        assert wait_until(lambda: not exists(docker_client, box.id), 30)
        assert httpx.get(f"{gw.url}/programs/p1").status_code == 404


def test_custom_hook_runs_before_the_container_is_removed(
    engine: FakeEngine,
    tmp_path: Path,
    sandbox: Callable[..., Container],
    docker_client: docker.DockerClient,
) -> None:
    box = sandbox()
    tool_hooks.CALLS.clear()
    with gateway(engine, tmp_path, reclaim=["support.tool_hooks:record", "stop", "remove"]) as gw:
        step(gw, "p1", [box.id])
        release(gw, "p1")
        assert wait_until(lambda: not exists(docker_client, box.id), 30)
    assert tool_hooks.CALLS == [(box.id, "p1", "release")]


def test_reclaim_metrics_count_reclaimed_containers(
    engine: FakeEngine,
    tmp_path: Path,
    sandbox: Callable[..., Container],
    docker_client: docker.DockerClient,
) -> None:
    box = sandbox()
    with gateway(engine, tmp_path) as gw:
        step(gw, "p1", [box.id])
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'thunder_mw_tool_containers{state="owned"} 1.0' in metrics
        release(gw, "p1")
        assert wait_until(lambda: not exists(docker_client, box.id), 30)
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'thunder_mw_tool_containers_reclaimed_total{reason="release"} 1.0' in metrics


# ------------------------------------------------------------------ what must be refused
def test_unlabelled_container_is_refused_and_survives_a_release_naming_it(
    engine: FakeEngine,
    tmp_path: Path,
    sandbox: Callable[..., Container],
    docker_client: docker.DockerClient,
) -> None:
    stranger = sandbox(managed=False)
    with gateway(engine, tmp_path) as gw:
        r = step(gw, "p1", [stranger.id])
        assert r.status_code == 403 and error(r)["code"] == "container_not_managed"
        assert stranger.id in error(r)["message"]
        step(gw, "p1", [])
        release(gw, "p1")
        gw.call(gw.tools.sweep())
    assert exists(docker_client, stranger.id)


def test_a_refused_request_adopts_none_of_its_containers(
    engine: FakeEngine,
    tmp_path: Path,
    sandbox: Callable[..., Container],
    docker_client: docker.DockerClient,
) -> None:
    box, stranger = sandbox(), sandbox(managed=False)
    with gateway(engine, tmp_path) as gw:
        assert step(gw, "p1", [box.id, stranger.id]).status_code == 403
        step(gw, "p1", [])
        release(gw, "p1")
        gw.call(gw.tools.sweep())
        assert gw.tools.counts()["reclaiming"] == 0
    assert exists(docker_client, box.id)


def test_unknown_container_is_a_400_naming_it(
    engine: FakeEngine, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    with gateway(engine, tmp_path) as gw:
        r = step(gw, "p1", ["no-such-container-42"])
    assert r.status_code == 400
    assert error(r)["code"] == "container_not_found" and error(r)["param"] == "docker_ids[0]"
    assert "no-such-container-42" in error(r)["message"]


def test_container_owned_by_another_program_is_a_409_naming_it(
    engine: FakeEngine, tmp_path: Path, sandbox: Callable[..., Container]
) -> None:
    box = sandbox()
    with gateway(engine, tmp_path) as gw:
        assert step(gw, "owner", [box.id]).status_code == 200
        r = step(gw, "thief", [box.name])
    assert r.status_code == 409 and error(r)["code"] == "container_owned"
    assert box.name in error(r)["message"] and "owner" in error(r)["message"]


def test_the_same_id_twice_in_one_list_is_a_400(
    engine: FakeEngine, tmp_path: Path, sandbox: Callable[..., Container]
) -> None:
    box = sandbox()
    with gateway(engine, tmp_path) as gw:
        r = step(gw, "p1", [box.id, box.id])
    assert r.status_code == 400 and error(r)["param"] == "docker_ids[1]"


def test_65_ids_are_a_400(
    engine: FakeEngine, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    with gateway(engine, tmp_path) as gw:
        r = step(gw, "p1", [f"box-{i}" for i in range(65)])
    assert r.status_code == 400 and "64" in error(r)["message"]


def test_release_of_an_unknown_program_answers_released_false(
    engine: FakeEngine, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    with gateway(engine, tmp_path) as gw:
        r = release(gw, "nobody")
    assert r.status_code == 200 and r.json() == {"program_id": "nobody", "released": False}


# ------------------------------------------------------------------ engine trouble
def test_engine_outage_keeps_serving_and_retries_the_reclaim(
    engine: FakeEngine,
    tmp_path: Path,
    sandbox: Callable[..., Container],
    docker_client: docker.DockerClient,
) -> None:
    box = sandbox()
    with gateway(engine, tmp_path, retry_max_interval_s=0.2) as gw:
        assert step(gw, "p1", [box.id]).status_code == 200
        real = gw.tools.engine._client
        gw.tools.engine._client = docker.DockerClient(
            base_url="unix:///nonexistent.sock", version="1.41"
        )
        release(gw, "p1")

        def reported() -> bool:
            tools = httpx.get(f"{gw.url}/health").json()["tools"]["docker"]
            return not tools["engine_up"] and bool(tools["reclaims_failing"])

        assert wait_until(reported, 30)
        assert step(gw, "p2", []).status_code == 200
        assert exists(docker_client, box.id)
        gw.tools.engine._client = real
        assert wait_until(lambda: not exists(docker_client, box.id), 30)
        health = httpx.get(f"{gw.url}/health").json()["tools"]["docker"]
        assert health["engine_up"] and health["reclaims_failing"] == []


def test_auto_mode_without_an_engine_is_off_and_says_so(engine: FakeEngine, tmp_path: Path) -> None:
    with gateway(engine, tmp_path, enabled="auto", engine_url="unix:///nonexistent.sock") as gw:
        assert step(gw, "p1", ["anything"]).status_code == 200
        tools = httpx.get(f"{gw.url}/health").json()["tools"]["docker"]
    assert tools["enabled"] is False and "no Docker engine" in tools["reason"]


# ------------------------------------------------------------------ warm pool
def _template(run: str, pool_size: int) -> dict[str, Any]:
    return {
        "name": "box",
        "image": IMAGE,
        "command": ["sleep", "300"],
        "labels": {TEST_LABEL: "1", "run": run},
        "mem_limit": "64m",
        "pool_size": pool_size,
    }


def _ours(docker_client: docker.DockerClient, run: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = docker_client.api.containers(
        all=True, quiet=True, filters={"label": f"run={run}"}
    )
    return found


def test_warm_pool_hands_out_faster_than_a_cold_start(
    engine: FakeEngine, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    run = uuid.uuid4().hex
    with gateway(engine, tmp_path, templates=[_template(run, 1)]) as gw:
        assert wait_until(lambda: gw.tools.status()["pool_ready"]["box"] == 1, 30)
        url = f"{gw.url}/programs/{{}}/sandboxes"
        warm = httpx.post(url.format("p-warm"), json={"template": "box"}, timeout=60).json()
        cold = httpx.post(url.format("p-cold"), json={"template": "box"}, timeout=60).json()
        print(f"\nsandbox hand-out: warm {warm['ready_s']:.4f} s, cold {cold['ready_s']:.4f} s")
        assert warm["warm"] and not cold["warm"]
        assert warm["ready_s"] < cold["ready_s"]
        box = docker_client.containers.get(warm["container_id"])
        assert box.status == "running" and box.labels["thunder-mw.managed"] == "true"
        listed = httpx.get(f"{gw.url}/programs/p-warm").json()["containers"]
        assert [c["id"] for c in listed] == [warm["container_id"]]
        assert release(gw, "p-warm").json()["released"] is True
        assert wait_until(lambda: not exists(docker_client, warm["container_id"]), 30)
        release(gw, "p-cold")
    assert wait_until(lambda: not _ours(docker_client, run), 30)


def test_a_handed_out_sandbox_is_adopted_by_its_programs_requests(
    engine: FakeEngine, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    run = uuid.uuid4().hex
    with gateway(engine, tmp_path, templates=[_template(run, 0)]) as gw:
        box = httpx.post(
            f"{gw.url}/programs/p1/sandboxes", json={"template": "box"}, timeout=60
        ).json()
        assert step(gw, "p1", [box["container_id"]]).status_code == 200
        assert step(gw, "p2", [box["name"]]).status_code == 409
        release(gw, "p1")
        assert wait_until(lambda: not exists(docker_client, box["container_id"]), 30)


def test_unknown_template_is_a_404(
    engine: FakeEngine, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    with gateway(engine, tmp_path) as gw:
        r = httpx.post(f"{gw.url}/programs/p1/sandboxes", json={"template": "nope"})
    assert r.status_code == 404 and error(r)["code"] == "template_not_found"


def test_pool_containers_are_reclaimed_on_shutdown(
    engine: FakeEngine, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    run = uuid.uuid4().hex
    with gateway(engine, tmp_path, templates=[_template(run, 2)]) as gw:
        assert wait_until(lambda: gw.tools.status()["pool_ready"]["box"] == 2, 30)
        assert len(_ours(docker_client, run)) == 2
    assert _ours(docker_client, run) == []


def test_a_container_started_with_rm_is_reclaimed_without_a_retry(
    docker_client: docker.DockerClient,
) -> None:
    """`--rm` (mini-SWE-agent's default): Docker removes the container once stopped, so the
    remove step may meet "removal already in progress" (409): that is reclaimed, not an
    engine failure to retry."""
    from thunder_mw.tools.docker_engine import DockerEngine

    engine = DockerEngine(None, 2, 30.0)
    try:
        for _ in range(3):  # the race is the engine's: try it a few times
            box = docker_client.containers.run(
                IMAGE,
                ["sleep", "300"],
                detach=True,
                auto_remove=True,
                network_mode="none",
                labels={TEST_LABEL: "1"},
            )
            engine.reclaim(box.id, ["stop", "remove"], {}, "p", "release", 0)

            def gone(box: Container = box) -> bool:
                return not exists(docker_client, box.id)

            assert wait_until(gone, 30)
    finally:
        engine.close()
