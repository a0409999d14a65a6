"""`agent_context.program_owner: header`: a program id belongs to the API key that first used it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from support.asgi_servers import serving
from support.fake_engine import FakeEngine

from thunder_mw.middleware.app import ThunderMiddleware, create_app
from thunder_mw.middleware.call_state import STATE_KEY, CallState
from thunder_mw.middleware.program_ownership import ProgramOwnership
from thunder_mw.middleware.scheduling import Rejected, SchedulingMiddleware
from thunder_mw.middleware.types import Message
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import ThunderConfig

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


class Stack:
    def __init__(self, engine: FakeEngine, url: str, app: Any) -> None:
        self.engine, self.url, self.app = engine, url, app

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)

    def chat(self, key: str, program_id: str, headers: dict[str, str] | None = None) -> Any:
        with self.client(key) as client:
            return client.chat.completions.create(
                model="fake-model",
                messages=MESSAGES,
                max_tokens=2,
                extra_body={"program_id": program_id},
                extra_headers=headers,
            )

    def release(self, program_id: str, headers: dict[str, str] | None = None) -> httpx.Response:
        return httpx.post(
            f"{self.url}/programs/release", json={"program_id": program_id}, headers=headers
        )


@contextlib.contextmanager
def owned_stack(**server: Any) -> Iterator[Stack]:
    engine = FakeEngine(chunks=2)
    with serving(engine) as es:
        config = ThunderConfig(
            backends=[{"name": "e", "url": es.url}],
            agent_context={"program_owner": "header"},
            server=server,
        )
        app = create_app(config)
        with serving(app) as gw:
            yield Stack(engine, gw.url, app)


@pytest.fixture
def stack() -> Iterator[Stack]:
    with owned_stack() as s:
        yield s


def test_the_key_that_started_a_program_keeps_using_it(stack: Stack) -> None:
    stack.chat("sk-alice", "agent-1")
    answer = stack.chat("sk-alice", "agent-1")
    assert answer.choices[0].message.content == "tok tok "
    assert len(stack.engine.received) == 2


def test_another_key_gets_403_naming_the_program_id(stack: Stack) -> None:
    stack.chat("sk-alice", "agent-1")
    with pytest.raises(openai.PermissionDeniedError) as info:
        stack.chat("sk-mallory", "agent-1")
    error = info.value.body
    assert isinstance(error, dict)
    assert info.value.status_code == 403
    assert error["code"] == "program_owned_by_another_key" and error["param"] == "program_id"
    assert error["type"] == "permission_error"
    assert len(stack.engine.received) == 1  # the refused request never reached the engine


def test_a_request_without_the_key_gets_403_for_an_owned_program(stack: Stack) -> None:
    stack.chat("sk-alice", "agent-1")
    r = httpx.post(
        f"{stack.url}/v1/chat/completions",
        json={"model": "m", "messages": MESSAGES, "program_id": "agent-1"},
    )
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "program_owned_by_another_key"


def test_a_first_request_without_the_key_gets_401_and_binds_nothing(stack: Stack) -> None:
    r = httpx.post(
        f"{stack.url}/v1/chat/completions",
        json={"model": "m", "messages": MESSAGES, "program_id": "agent-1"},
    )
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "owner_key_required"
    assert r.json()["error"]["param"] == "authorization"
    stack.chat("sk-alice", "agent-1")  # still free for the first client that has a key


def test_requests_without_a_program_id_need_no_key(stack: Stack) -> None:
    r = httpx.post(f"{stack.url}/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 200


def test_the_owner_binding_holds_a_digest_never_the_key(stack: Stack) -> None:
    stack.chat("sk-alice-distinctive", "agent-1")
    owners = stack.app.core.owners.owners
    (digest,) = owners._owner.values()
    assert len(digest) == 32 and b"sk-alice-distinctive" not in digest
    listing = httpx.get(f"{stack.url}/programs").text
    assert "sk-alice-distinctive" not in listing


def test_another_key_cannot_release_the_program(stack: Stack) -> None:
    stack.chat("sk-alice", "agent-1")
    r = stack.release("agent-1", {"Authorization": "Bearer sk-mallory"})
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "program_owned_by_another_key"
    assert httpx.get(f"{stack.url}/programs/agent-1").status_code == 200


def test_the_owner_releases_and_the_id_is_free_again(stack: Stack) -> None:
    stack.chat("sk-alice", "agent-1")
    r = stack.release("agent-1", {"Authorization": "Bearer sk-alice"})
    assert r.status_code == 200 and r.json()["released"] is True
    assert stack.chat("sk-bob", "agent-1").choices  # a new program under a new owner
    with pytest.raises(openai.PermissionDeniedError):
        stack.chat("sk-alice", "agent-1")


def test_a_final_request_frees_the_id(stack: Stack) -> None:
    stack.chat("sk-alice", "agent-1", {"X-Dynamo-Session-Final": "true"})
    assert stack.chat("sk-bob", "agent-1").choices


def test_admin_token_holders_release_any_program() -> None:
    with owned_stack(admin_token="adm-token") as stack:
        stack.chat("sk-alice", "agent-1")
        r = stack.release("agent-1", {"Authorization": "Bearer adm-token"})
        assert r.status_code == 200 and r.json()["released"] is True


def test_ownership_is_off_by_default(engine: FakeEngine) -> None:
    config = ThunderConfig(backends=[{"name": "e", "url": engine.url}])
    with serving(create_app(config)) as gw:
        for key in ("sk-alice", "sk-bob"):
            with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0) as client:
                client.chat.completions.create(
                    model="m", messages=MESSAGES, extra_body={"program_id": "agent-1"}
                )
    assert len(engine.received) == 2


def test_a_custom_owner_header_is_honoured(engine: FakeEngine) -> None:
    config = ThunderConfig(
        backends=[{"name": "e", "url": engine.url}],
        agent_context={"program_owner": "header", "program_owner_header": "X-Api-Key"},
    )
    body = {"model": "m", "messages": MESSAGES, "program_id": "agent-1"}
    with serving(create_app(config)) as gw:
        url = f"{gw.url}/v1/chat/completions"
        assert httpx.post(url, json=body, headers={"x-api-key": "k1"}).status_code == 200
        refused = httpx.post(url, json=body, headers={"x-api-key": "k2"})
    assert refused.status_code == 403


# ------------------------------------------------------------------ without a server
class _RefusingScheduler:
    """Admission says no (queue full) and creates no program."""

    async def admit(self, call: CallState) -> str:
        raise Rejected(429, "queue full", "queue_full")

    def program(self, program_id: str) -> None:
        return None


def _call(mw: SchedulingMiddleware, key: bytes) -> int:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    call = CallState()
    call.context = AgentContext(program_id="agent-1", source=None)
    scope = {
        "type": "http",
        "headers": [(b"authorization", key)],
        "state": {STATE_KEY: call},
    }
    asyncio.run(mw(scope, receive, send))
    status: int = sent[0]["status"]
    return status


def test_a_first_request_that_never_ran_leaves_no_owner() -> None:
    async def never_called(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("forwarded")

    mw = SchedulingMiddleware(
        never_called,
        _RefusingScheduler(),  # type: ignore[arg-type]
        owners=ProgramOwnership("authorization"),
    )
    assert _call(mw, b"Bearer sk-alice") == 429
    assert _call(mw, b"Bearer sk-bob") == 429  # not 403: alice's refused request owns nothing


def test_gateway_mode_binds_programs_too(engine: FakeEngine) -> None:
    async def wrapped_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    config = ThunderConfig(
        backends=[{"name": "e", "url": engine.url}], agent_context={"program_owner": "header"}
    )
    body = {"model": "m", "messages": MESSAGES, "program_id": "agent-1"}
    with serving(ThunderMiddleware(wrapped_app, config)) as server:
        url = f"{server.url}/v1/chat/completions"
        first = httpx.post(url, json=body, headers={"Authorization": "Bearer sk-alice"})
        other = httpx.post(url, json=body, headers={"Authorization": "Bearer sk-bob"})
    assert first.status_code == 200
    assert other.status_code == 403
    assert other.json()["error"]["code"] == "program_owned_by_another_key"
