"""Property: whatever bytes, JSON, ids, query strings, methods and tokens reach the admin API,
it never answers 5xx, every error is JSON naming the problem, and every route it answers is
one its OpenAPI description (GET /openapi.json) lists."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from thunder_mw import __version__
from thunder_mw.middleware.app import ThunderGateway
from thunder_mw.middleware.openapi import admin_openapi
from thunder_mw.middleware.types import Message
from thunder_mw.schemas.config import ThunderConfig

ADMIN_TOKEN = "fuzz-admin-token"
AUTH = (b"authorization", f"Bearer {ADMIN_TOKEN}".encode())
SEEDED = "fuzz-seeded-program"
# The error codes of a request the router has no route for: everything else was answered.
NO_ROUTE = {"route_not_found", "method_not_allowed"}
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
GET_PATHS = [
    "/health",
    "/metrics",
    "/openapi.json",
    "/programs",
    f"/programs/{SEEDED}",
    "/profiles",
    f"/profiles/{SEEDED}",
    "/dashboard",
    "/dashboard/",
    "/dashboard/state",
]
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
# Ids as they reach the router once the server decoded the path: any text, slashes included.
# (Not SEEDED: the release tests would end it; the lookup test adds it.)
path_ids = st.text(max_size=80) | st.sampled_from(["", " ", "release", "a/b", "x" * 300])
query_strings = st.binary(max_size=120) | st.builds(
    lambda pairs: "&".join(f"{k}={v}" for k, v in pairs).encode("utf-8", "surrogatepass"),
    st.lists(st.tuples(st.sampled_from(["token", "program_id", "x", ""]), st.text(max_size=20))),
)


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class AdminClient:
    """Drives one gateway app in-process on a loop of its own, one request at a time."""

    def __init__(self, app: ThunderGateway, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop

    def request(
        self,
        method: str,
        path: str,
        *,
        query: bytes = b"",
        body: list[bytes] | bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> Answer:
        chunks = [body] if isinstance(body, bytes) else list(body) or [b""]
        return self.loop.run_until_complete(
            self._request(method, path, query, chunks, [AUTH] if headers is None else headers)
        )

    async def _request(
        self,
        method: str,
        path: str,
        query: bytes,
        chunks: list[bytes],
        headers: list[tuple[bytes, bytes]],
    ) -> Answer:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("utf-8", "surrogatepass"),
            "query_string": query,
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), *headers],
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8300),
        }
        pending = list(chunks)
        sent: list[Message] = []

        async def receive() -> Message:
            if pending:
                chunk = pending.pop(0)
                return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        start = sent[0]
        assert start["type"] == "http.response.start"
        return Answer(
            start["status"],
            dict(start["headers"]),
            b"".join(m.get("body", b"") for m in sent[1:]),
        )


@pytest.fixture(scope="module")
def admin() -> Iterator[AdminClient]:
    """A gateway (admin token set, Docker tools off) on an embedded simulated engine, holding
    one program that has answered a call."""
    config = ThunderConfig(
        backends=[{"name": "sim-0", "type": "sim", "sim": {"num_blocks": 256}}],
        server={"admin_token": ADMIN_TOKEN},
        tools={"docker": {"enabled": False}},
    )
    app = ThunderGateway(config)
    loop = asyncio.new_event_loop()
    client = AdminClient(app, loop)
    try:
        seeded = client.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(
                {
                    "model": "sim-model",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4,
                    "program_id": SEEDED,
                }
            ).encode(),
        )
        assert seeded.status == 200, seeded.body
        yield client
    finally:
        loop.run_until_complete(app.core.shutdown())
        loop.close()


def assert_no_server_error(answer: Answer) -> None:
    assert answer.status < 500, (answer.status, answer.body[:300])


def assert_error_names_the_problem(answer: Answer) -> dict[str, Any]:
    """A 4xx is an OpenAI-style JSON error whose `code` (and message) say what was wrong."""
    assert 400 <= answer.status < 500, (answer.status, answer.body[:300])
    assert answer.headers[b"content-type"] == b"application/json"
    error: dict[str, Any] = answer.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert isinstance(error["code"], str) and error["code"], error
    return error


def assert_well_formed(answer: Answer) -> None:
    assert_no_server_error(answer)
    if answer.status >= 400:
        assert_error_names_the_problem(answer)
    elif answer.headers[b"content-type"] == b"application/json":
        answer.json()


# ---------------------------------------------------------------- request bodies
@FUZZ
@given(chunks=st.lists(st.binary(max_size=64), max_size=4))
@example(chunks=[b"[" * 60_000])  # nested past the decoder's recursion limit
@example(chunks=[b'{"program_id": 1e999}'])
@example(chunks=[b'\xef\xbb\xbf{"program_id": "p"}'])
@example(chunks=[b'{"program_id": "\\ud800"}'])
def test_release_answers_arbitrary_bytes_with_200_or_a_named_400(
    admin: AdminClient, chunks: list[bytes]
) -> None:
    answer = admin.request("POST", "/programs/release", body=chunks)
    assert_well_formed(answer)
    if answer.status != 200:
        assert assert_error_names_the_problem(answer)["param"] in ("body", "program_id")


@FUZZ
@given(
    body=json_values
    | st.fixed_dictionaries({"program_id": json_values | path_ids}, optional={"x": json_values})
)
def test_release_answers_arbitrary_json_with_200_or_a_400_naming_the_field(
    admin: AdminClient, body: Any
) -> None:
    answer = admin.request("POST", "/programs/release", body=json.dumps(body).encode())
    assert_well_formed(answer)
    if answer.status == 200:
        assert answer.json()["program_id"] == body["program_id"]
    else:
        assert answer.status == 400
        expected = "program_id" if isinstance(body, dict) else "body"
        assert answer.json()["error"]["param"] == expected


def test_release_answers_a_body_over_the_limit_with_413(admin: AdminClient) -> None:
    answer = admin.request("POST", "/programs/release", body=[b" " * 40_000] * 2)
    assert answer.status == 413
    assert assert_error_names_the_problem(answer)["code"] == "body_too_large"


@FUZZ
@given(
    program_id=path_ids,
    body=st.binary(max_size=64).map(lambda b: [b])
    | (json_values | st.fixed_dictionaries({"template": json_values})).map(
        lambda v: [json.dumps(v).encode()]
    ),
)
def test_sandbox_request_answers_arbitrary_ids_and_bodies_without_a_server_error(
    admin: AdminClient, program_id: str, body: list[bytes]
) -> None:
    answer = admin.request("POST", f"/programs/{program_id}/sandboxes", body=body)
    assert_no_server_error(answer)
    error = assert_error_names_the_problem(answer)  # Docker tools are off: never a sandbox
    assert error["param"] in ("body", "program_id", "template"), error


def test_sandbox_request_with_the_tool_manager_off_is_a_404_saying_so(admin: AdminClient) -> None:
    answer = admin.request("POST", "/programs/p1/sandboxes", body=b'{"template": "py"}')
    assert answer.status == 404
    assert assert_error_names_the_problem(answer)["code"] == "tools_disabled"


# ---------------------------------------------------------------- query strings, ids
@FUZZ
@given(path=st.sampled_from(GET_PATHS), query=query_strings)
def test_get_routes_ignore_arbitrary_query_strings(
    admin: AdminClient, path: str, query: bytes
) -> None:
    answer = admin.request("GET", path, query=query)
    assert answer.status == 200, (path, query, answer.body[:300])
    if answer.headers[b"content-type"] == b"application/json":
        answer.json()


@FUZZ
@given(prefix=st.sampled_from(["/programs/", "/profiles/"]), program_id=path_ids | st.just(SEEDED))
def test_lookups_of_arbitrary_ids_answer_200_or_a_named_404(
    admin: AdminClient, prefix: str, program_id: str
) -> None:
    answer = admin.request("GET", prefix + program_id)
    assert_well_formed(answer)
    if answer.status == 200:
        assert answer.json()["program_id"] == program_id
    else:
        assert answer.status == 404
        assert answer.json()["error"]["code"] in ("program_not_found", "profile_not_found")


def test_seeded_program_and_its_profile_are_found(admin: AdminClient) -> None:
    assert admin.request("GET", f"/programs/{SEEDED}").json()["program_id"] == SEEDED
    assert admin.request("GET", f"/profiles/{SEEDED}").json()["steps_total"] == 1


# ---------------------------------------------------------------- authorization
@FUZZ
@given(
    path=st.sampled_from([*GET_PATHS, "/programs/release"]),
    value=st.binary(max_size=60).filter(lambda v: v != AUTH[1]),
)
def test_a_wrong_authorization_header_is_a_401_except_on_health(
    admin: AdminClient, path: str, value: bytes
) -> None:
    answer = admin.request("GET", path, headers=[(b"authorization", value)])
    if path == "/health":
        assert answer.status == 200
    else:
        assert answer.status == 401
        assert assert_error_names_the_problem(answer)["code"] == "unauthorized"
        assert answer.headers[b"www-authenticate"] == b"Bearer"


@FUZZ
@given(
    pairs=st.lists(
        st.tuples(st.sampled_from(["token", "x"]), st.text(max_size=20) | st.just(ADMIN_TOKEN)),
        max_size=4,
    )
)
def test_the_dashboard_token_query_lets_in_only_the_admin_token(
    admin: AdminClient, pairs: list[tuple[str, str]]
) -> None:
    answer = admin.request("GET", "/dashboard", query=urlencode(pairs).encode(), headers=[])
    # The first non-blank `token` counts (blank values are no value at all).
    first = next((v for k, v in pairs if k == "token" and v), None)
    if first == ADMIN_TOKEN:
        assert answer.status == 200
    else:
        assert assert_error_names_the_problem(answer)["code"] == "unauthorized"


@FUZZ
@given(query=query_strings)
def test_the_dashboard_answers_any_query_string_with_200_or_401(
    admin: AdminClient, query: bytes
) -> None:
    answer = admin.request("GET", "/dashboard", query=query, headers=[])
    assert answer.status == 401 or (answer.status == 200 and ADMIN_TOKEN.encode() in query)


def test_openapi_document_needs_the_admin_token(admin: AdminClient) -> None:
    assert admin.request("GET", "/openapi.json", headers=[]).status == 401
    answer = admin.request("GET", "/openapi.json")
    assert answer.status == 200 and answer.json() == admin_openapi(__version__)


# ---------------------------------------------------------------- routes vs description
def _operations() -> list[tuple[str, re.Pattern[str]]]:
    """(METHOD, path pattern) of every operation the description lists; an id may hold
    slashes, as a percent-encoded one arrives decoded."""
    operations: list[tuple[str, re.Pattern[str]]] = []
    for template, item in admin_openapi(__version__)["paths"].items():
        pattern = re.compile(re.sub(r"\\\{[a-z_]+\\\}", ".*", re.escape(template)) + r"\Z", re.S)
        operations.extend((method.upper(), pattern) for method in item)
    return operations


OPERATIONS = _operations()


def _described(method: str, path: str) -> bool:
    return any(m == method and p.match(path) for m, p in OPERATIONS)


def _answered(answer: Answer) -> bool:
    """Whether the router had a route for the request (whatever it then answered)."""
    if answer.status not in (404, 405):
        return True
    return answer.json()["error"]["code"] not in NO_ROUTE


admin_paths = st.sampled_from(
    ["/health", "/metrics", "/openapi.json", "/programs", "/programs/release"]
    + [f"/{root}/" for root in ("programs", "profiles", "dashboard")]
) | st.builds(
    lambda root, rest: f"/{root}/{rest}",
    st.sampled_from(["programs", "profiles", "dashboard"]),
    st.text(alphabet=st.sampled_from("ab/ %\x00é"), max_size=12)
    | st.sampled_from(["state", "x/sandboxes", "release", "/sandboxes", "p/q/sandboxes"]),
)


@FUZZ
@given(method=st.sampled_from(METHODS), path=admin_paths)
def test_every_route_the_server_answers_is_described(
    admin: AdminClient, method: str, path: str
) -> None:
    answer = admin.request(method, path, body=b'{"program_id": "p", "template": "t"}')
    assert_well_formed(answer)
    if _answered(answer):
        assert _described(method, path), f"{method} {path} answered {answer.status}, undescribed"
    else:
        assert not _described(method, path), f"{method} {path} is described but not routed"
    if answer.status == 405:
        allowed = {m for m, pattern in OPERATIONS if pattern.match(path)}
        assert set(filter(None, answer.headers[b"allow"].decode().split(", "))) == allowed


def test_every_described_operation_is_routed(admin: AdminClient) -> None:
    document = admin_openapi(__version__)
    for template, item in document["paths"].items():
        path = template.replace("{program_id}", SEEDED)
        for method in item:
            answer = admin.request(method.upper(), path, body=b'{"program_id": "p"}')
            assert _answered(answer), f"{method.upper()} {template}: {answer.body[:200]!r}"
