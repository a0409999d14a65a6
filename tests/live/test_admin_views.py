"""The admin API answers the structs of schemas/views.py, its OpenAPI components are those
structs' schemas, and the public program view carries no internal bookkeeping."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest

from thunder_mw import __version__
from thunder_mw.middleware.app import ThunderGateway
from thunder_mw.middleware.openapi import admin_openapi
from thunder_mw.schemas import rollout_views, views
from thunder_mw.schemas.config import ThunderConfig

PROGRAM = "views-program"
INTERNAL_FIELDS = ("version", "last_prompt_chars")
REF = "#/components/schemas/"


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


@pytest.fixture(scope="module")
def answers() -> dict[str, httpx.Response]:
    """What a gateway (simulated engine, no admin token) answers on its admin routes once a
    program has answered a call."""

    async def run() -> dict[str, httpx.Response]:
        app = ThunderGateway(
            ThunderConfig(
                backends=[{"name": "sim-0", "type": "sim", "sim": {"num_blocks": 256}}],
                tools={"docker": {"enabled": False}},
            )
        )
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                seeded = await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "sim-model",
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4,
                        "program_id": PROGRAM,
                    },
                )
                assert seeded.status_code == 200, seeded.text
                paths = ["/health", "/programs", f"/programs/{PROGRAM}", "/dashboard/state"]
                got = {path: await client.get(path) for path in paths}
                got["PUT /programs/release"] = await client.put("/programs/release")
                return got
        finally:
            await app.core.shutdown()

    return asyncio.run(run())


def test_the_public_program_view_carries_no_internal_fields(
    answers: dict[str, httpx.Response],
) -> None:
    listed = answers["/programs"].json()["programs"]
    one = answers[f"/programs/{PROGRAM}"].json()
    for view in (*listed, one):
        assert not set(INTERNAL_FIELDS) & set(view), view
        assert set(view) == set(views.ProgramView.__struct_fields__)


@pytest.mark.parametrize(
    ("path", "struct"),
    [
        ("/health", views.HealthView),
        ("/programs", views.ProgramList),
        (f"/programs/{PROGRAM}", views.ProgramDetail),
        ("/dashboard/state", views.DashboardState),
    ],
)
def test_each_route_answers_its_struct(
    answers: dict[str, httpx.Response], path: str, struct: type[msgspec.Struct]
) -> None:
    answer = answers[path]
    assert answer.status_code == 200
    msgspec.json.decode(answer.content, type=struct, strict=True)


def test_every_schema_reference_in_the_description_is_a_component() -> None:
    document = admin_openapi(__version__)
    components = document["components"]["schemas"]
    refs = set(_refs(document))
    assert refs, "the description references no schema"
    for ref in refs:
        if ref.startswith(REF):
            assert ref.removeprefix(REF) in components, ref


def test_the_components_are_the_schemas_of_the_view_structs() -> None:
    document = admin_openapi(__version__)
    components = document["components"]["schemas"]
    structs = {
        name: value
        for module in (views, rollout_views)
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, msgspec.Struct)
    }
    for name, schema in components.items():
        assert name in structs, f"component {name} is no struct of schemas/(rollout_)views.py"
        (_, generated) = msgspec.json.schema_components(
            [structs[name]], ref_template=REF + "{name}"
        )
        assert generated[name] == schema
    for template, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if status.startswith("2") and "application/json" in response.get("content", {}):
                    schema = response["content"]["application/json"]["schema"]
                    if template != "/openapi.json":
                        assert list(_refs(schema)), f"{method} {template}: not a struct"


def test_a_405_allows_every_method_of_the_routes_matching_the_path(
    answers: dict[str, httpx.Response],
) -> None:
    answer = answers["PUT /programs/release"]
    assert answer.status_code == 405
    assert answer.headers["allow"] == "GET, POST"
    assert answer.json()["error"]["code"] == "method_not_allowed"
