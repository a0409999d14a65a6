"""The admin API's one alias table: every alias names one canonical route and is served by
it (or by the endpoint of its own shape), the OpenAPI document lists each canonical route
once and marks each alias, and docs/architecture.md shows both tables."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Match

from thunder_mw import __version__
from thunder_mw.middleware.app import ThunderGateway
from thunder_mw.middleware.openapi import ALIASES, FAMILIES, OPERATIONS, ROUTES, admin_openapi
from thunder_mw.schemas.config import ThunderConfig

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
CANONICAL = {op.key: op for op in OPERATIONS}


def config() -> ThunderConfig:
    sim = {"num_blocks": 256, "block_size": 16, "time_scale": 50.0}
    return ThunderConfig(
        backends=[{"name": "sim-0", "type": "sim", "sim": sim}],
        tools={"docker": {"enabled": False}},
    )


def concrete(path: str) -> str:
    """A request path for a route template (each parameter filled with a name)."""
    return re.sub(r"\{\w+(:\w+)?\}", "sim-0", path)


def served_by(app: ThunderGateway, method: str, path: str) -> Any:
    scope = {"type": "http", "method": method, "path": path, "path_params": {}}
    for route in app.core.admin.routes:
        match, child = route.matches(scope)
        if match is Match.FULL:
            return child["endpoint"]
    raise AssertionError(f"no route serves {method} {path}")


def test_every_alias_names_one_canonical_route_and_is_none_itself() -> None:
    assert len(CANONICAL) == len(OPERATIONS), "a canonical route is listed twice"
    keys = [(alias.method, alias.path) for alias in ALIASES]
    assert len(set(keys)) == len(keys), "an alias is listed twice"
    canonical_paths = {(op.method, op.path) for op in OPERATIONS}
    for alias in ALIASES:
        assert alias.canonical in CANONICAL, f"{alias.path}: no canonical {alias.canonical}"
        assert (alias.method, alias.path) not in canonical_paths
        if alias.shape is None:
            assert alias.method == CANONICAL[alias.canonical].method
    assert len(ROUTES) == len(OPERATIONS) + len(ALIASES)
    assert {op.family for op in OPERATIONS} == set(FAMILIES)


def test_the_router_serves_each_alias_by_its_canonical_route_or_its_own_shape() -> None:
    app = ThunderGateway(config())
    for alias in ALIASES:
        canonical = CANONICAL[alias.canonical]
        endpoint = served_by(app, alias.method, concrete(alias.path))
        if alias.shape is None:
            expected = served_by(app, canonical.method, concrete(canonical.path))
        else:
            name = alias.shape.endpoint.removeprefix("rollout.")
            expected = getattr(app.core.admin.rollout, name)
        assert endpoint == expected, f"{alias.method} {alias.path}"


def test_the_openapi_document_lists_each_canonical_route_once_and_marks_each_alias() -> None:
    document = admin_openapi(__version__)
    canonical: list[str] = []
    aliases: dict[str, str] = {}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            key = f"{method.upper()} {path}"
            assert operation["tags"][0] in FAMILIES, key
            if "x-alias-of" in operation:
                aliases[key] = operation["x-alias-of"]
                assert operation["x-alias-of"] in operation["description"]
                assert "deprecated" not in operation
            else:
                canonical.append(key)
    assert sorted(canonical) == sorted(CANONICAL)
    assert len(canonical) == len(set(canonical))
    served = [op for op in ROUTES if op.alias_of]
    assert [(op.method, op.path, op.alias_of) for op in served] == [
        (a.method, a.path, a.canonical) for a in ALIASES
    ]
    assert aliases == {op.key: op.alias_of for op in served}
    assert {tag["name"] for tag in document["tags"]} == set(FAMILIES)


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("GET /dashboard/", "GET /dashboard"),
        ("POST /resume", "POST /generation/resume"),
        ("POST /continue_generation", "POST /generation/resume"),
        ("POST /wake_up", "POST /generation/wake_up"),
    ],
)
def test_an_alias_as_is_answers_as_its_canonical_route(alias: str, canonical: str) -> None:
    async def run() -> None:
        app = ThunderGateway(config())
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=30
            ) as client:
                answers = [
                    await client.request(*spelling.split(" ")) for spelling in (canonical, alias)
                ]
        finally:
            await app.core.shutdown()
        first, second = answers
        assert first.status_code == second.status_code == 200
        assert first.headers["content-type"] == second.headers["content-type"]
        assert first.content == second.content

    asyncio.run(run())


def test_the_architecture_page_shows_both_tables() -> None:
    page = ARCHITECTURE.read_text()
    section = page.split("## The admin API", 1)[1].split("\n## ", 1)[0]
    for op in OPERATIONS:
        assert f"`{op.method} {op.openapi_path}`" in section, op.key
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    listed = {re.sub(r"\?.*", "", row.split("`")[1]): row for row in rows}
    for alias in ALIASES:
        path = re.sub(r"{(\w+):\w+}", r"{\1}", alias.path)
        row = listed.get(f"{alias.method} {path}")
        assert row is not None, f"{alias.method} {path} is not in the alias table"
        assert f"`{alias.canonical}`" in row
        assert ("as is" in row) == (alias.shape is None)
