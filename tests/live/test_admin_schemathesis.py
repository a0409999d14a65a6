"""Property: schemathesis, driven by the gateway's own /openapi.json, finds no 5xx on the live
admin API and every answer matches the description (status, content type, body schema, auth).

(Schemathesis never calls the path its schema came from; test_admin_fuzz covers /openapi.json,
and that every route the router answers is described.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)
from support.asgi_servers import ServerThread, serving
from support.fake_engine import FakeEngine

from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig

pytestmark = pytest.mark.slow  # schemathesis against a live gateway

ADMIN_TOKEN = "fuzz-admin-token"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# Bounded so the whole run stays well under a minute on a loaded 2-core machine.
MAX_EXAMPLES = 40
SEEDED_PROGRAM = "fuzz-seeded-program"


@pytest.fixture(scope="module")
def live_gateway() -> Iterator[ServerThread]:
    """The standalone gateway (Docker tools off) in front of an in-test engine, holding one
    program that has answered a call, so list and detail answers are not all empty."""
    engine = FakeEngine()
    with serving(engine) as engine_server:
        config = ThunderConfig(
            backends=[{"url": engine_server.url}],
            # Fuzzed POST /backends bodies name engines that are not there: refused fast.
            server={"admin_token": ADMIN_TOKEN, "connect_timeout_s": 0.5},
            tools={"docker": {"enabled": False}},
        )
        with serving(create_app(config)) as gateway:
            answer = httpx.post(
                f"{gateway.url}/v1/chat/completions",
                json={
                    "model": "fake-model",
                    "messages": [{"role": "user", "content": "hi"}],
                    "program_id": SEEDED_PROGRAM,
                },
                timeout=10,
            )
            assert answer.status_code == 200, answer.text
            yield gateway


@pytest.fixture(scope="module")
def admin_schema(live_gateway: ServerThread) -> schemathesis.schemas.BaseSchema:
    schema = schemathesis.openapi.from_url(f"{live_gateway.url}/openapi.json", headers=AUTH)
    schema.config.update(base_url=live_gateway.url)
    schema.config.generation.update(max_examples=MAX_EXAMPLES)
    return schema


admin_api = schemathesis.pytest.from_fixture("admin_schema")


def test_served_description_is_valid_openapi(admin_schema: schemathesis.schemas.BaseSchema) -> None:
    admin_schema.validate()  # raises on any violation of the OpenAPI 3.0 meta-schema
    assert admin_schema.raw_schema["openapi"].startswith("3.")


@admin_api.parametrize()
def test_admin_api_answers_no_5xx_and_matches_its_description(
    case: schemathesis.Case[Any],  # the operation type is the library's own generic
) -> None:
    case.call_and_validate(
        headers=AUTH,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            ignored_auth,
            unsupported_method,
        ],
    )
