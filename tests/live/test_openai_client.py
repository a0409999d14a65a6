"""The real OpenAI Python client talks to thunder-mw with the program id in `extra_body`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from support.asgi_servers import ServerThread, serving
from support.fake_engine import FakeEngine

from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig


@pytest.fixture
def stack() -> Iterator[tuple[FakeEngine, ServerThread, openai.OpenAI]]:
    engine = FakeEngine(chunks=4)
    with serving(engine) as es:
        cfg = ThunderConfig(backends=[{"name": "e", "url": es.url}])
        with serving(create_app(cfg)) as gw:
            with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-test", max_retries=0) as client:
                yield engine, gw, client


def test_non_streaming_call_with_extra_body(
    stack: tuple[FakeEngine, ServerThread, openai.OpenAI],
) -> None:
    engine, gw, client = stack
    answer = client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        extra_body={"program_id": "agent-1", "docker_ids": ["sandbox-1"]},
    )
    assert answer.choices[0].message.content == "tok tok tok tok "
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 4
    sent = engine.last().body
    assert "program_id" not in sent and "docker_ids" not in sent and sent["max_tokens"] == 4
    program = httpx.get(f"{gw.url}/programs/agent-1").json()
    assert program["docker_ids"] == ["sandbox-1"] and program["steps"] == 1


def test_streaming_call_with_extra_body(
    stack: tuple[FakeEngine, ServerThread, openai.OpenAI],
) -> None:
    _, gw, client = stack
    chunks = list(
        client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_body={"program_id": "agent-2"},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "t0 t1 t2 t3 "
    assert all(c.usage is None for c in chunks)  # no usage chunk the client did not ask for
    program = httpx.get(f"{gw.url}/programs/agent-2").json()
    assert program["completion_tokens"] == 4


def test_streaming_with_usage_requested(
    stack: tuple[FakeEngine, ServerThread, openai.OpenAI],
) -> None:
    _, _, client = stack
    chunks = list(
        client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"program_id": "agent-3"},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_invalid_program_id_raises_a_typed_error_naming_the_field(
    stack: tuple[FakeEngine, ServerThread, openai.OpenAI],
) -> None:
    _, _, client = stack
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="fake-model", messages=[], extra_body={"program_id": "   "}
        )
    assert isinstance(info.value.body, dict)
    assert info.value.body["param"] == "program_id"
