"""Scripted agent mode: the simulated engine answers chats with a task's bash tool calls."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from thunder_mw.schemas.config import SimEngineSettings
from thunder_mw.sim.embedded import EmbeddedEngine
from thunder_mw.sim.scripted_agent import SUBMIT_MARKER, next_call, script_for

TASK = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "fix it"}]


def _chat(bodies: list[dict[str, Any]], seed: int = 0) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        settings = SimEngineSettings(
            num_blocks=64, profile="instant", scripted_agent=True, seed=seed
        )
        engine = EmbeddedEngine(settings)
        url = await engine.start()
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                return [await client.post("/v1/chat/completions", json=b) for b in bodies]
        finally:
            await engine.stop()

    return asyncio.run(main())


def test_a_script_is_a_few_shell_steps_then_the_submit_command() -> None:
    for task in ("fix it", "another task", "a third"):
        script = script_for(task, 0)
        assert 3 <= len(script) <= 5
        assert script[-1].startswith(f"echo {SUBMIT_MARKER} && ")
        assert not any(SUBMIT_MARKER in step for step in script[:-1])


def test_the_script_depends_on_the_task_and_the_seed_only() -> None:
    assert script_for("fix it", 0) == script_for("fix it", 0)
    scripts = {tuple(script_for("fix it", seed)) for seed in range(8)}
    assert len(scripts) > 1


def test_the_answer_is_the_next_steps_bash_tool_call() -> None:
    script = script_for("fix it", 0)
    history = list(TASK)
    for step, command in enumerate(script):
        (r,) = _chat([{"model": "sim-model", "messages": history}])
        assert r.status_code == 200, r.text
        body = r.json()
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "bash"
        assert json.loads(call["function"]["arguments"]) == {"command": command}
        assert call["id"] == next_call(history, 0).call_id
        assert body["usage"]["completion_tokens"] > 0
        history += [
            choice["message"],
            {"role": "tool", "tool_call_id": call["id"], "content": "ok"},
        ]
        assert next_call(history[:-2], 0).last == (step == len(script) - 1)


def test_streaming_and_a_chat_without_a_task_are_400s_naming_the_field() -> None:
    system_only = [{"role": "system", "content": "x"}]
    streamed, no_task = _chat(
        [
            {"model": "sim-model", "messages": TASK, "stream": True},
            {"model": "sim-model", "messages": system_only},
        ]
    )
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream"
    assert no_task.status_code == 400 and no_task.json()["error"]["param"] == "messages"


def test_without_the_mode_the_engine_answers_text() -> None:
    async def main() -> httpx.Response:
        engine = EmbeddedEngine(SimEngineSettings(num_blocks=64, profile="instant"))
        url = await engine.start()
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                body = {"model": "sim-model", "messages": TASK, "max_tokens": 4}
                return await client.post("/v1/chat/completions", json=body)
        finally:
            await engine.stop()

    message = asyncio.run(main()).json()["choices"][0]["message"]
    assert message["tool_calls"] == [] and message["content"]
