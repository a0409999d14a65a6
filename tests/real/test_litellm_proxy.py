"""thunder-mw inside the real LiteLLM proxy (`litellm --config`, the `agents` extra): the
scheduler's engine choice picks LiteLLM's deployment, LiteLLM's usage feeds it, and a
program's calls stay on one deployment while overflow holds and resumes programs."""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from openai.types.chat import ChatCompletionMessageParam
from support.polling import wait_until

from thunder_mw.benchmarks.server_process import stop_process, wait_until_healthy
from thunder_mw.sim.ports import free_port

pytestmark = pytest.mark.slow

MODEL = "sim-model"
# Each engine: 127 usable blocks x 16 tokens = 2,032 tokens of KV, about three programs at
# their longest, so eight programs at once overflow the pair and the scheduler holds some.
NUM_BLOCKS = 128
PROGRAMS = 8
STEPS = 4
TOOL_S = 0.3
MASTER_KEY = f"sk-{secrets.token_hex(24)}"  # LiteLLM refuses to start without one


@contextmanager
def _process(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield proc
    finally:
        stop_process(proc, timeout_s=15)


@contextmanager
def _sim_engine(port: int, seed: int, tmp_path: Path) -> Iterator[str]:
    args = [sys.executable, "-m", "thunder_mw.cli.main", "sim-engine", "--port", str(port)]
    args += ["--num-blocks", str(NUM_BLOCKS), "--time-scale", "10", "--seed", str(seed)]
    url = f"http://127.0.0.1:{port}"
    with _process(args, tmp_path / f"sim-{seed}.log"):
        wait_until_healthy(url, timeout_s=30, log_path=tmp_path / f"sim-{seed}.log")
        yield url


def _wait_for(url: str, timeout_s: float, log: Path, proc: subprocess.Popen[bytes]) -> None:
    def answered_or_exited() -> bool:
        return proc.poll() is not None or httpx.get(url, timeout=2).status_code == 200

    def failure() -> str:
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        return f"{url} to answer (exit {proc.poll()}); log:\n{tail}"

    wait_until(
        answered_or_exited, timeout_s, interval_s=0.25, message=failure, ignoring=(httpx.HTTPError,)
    )
    if proc.poll() is not None:
        raise AssertionError(failure())


@contextmanager
def _litellm_proxy(engines: list[str], tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`litellm --config` with one deployment per engine (id = the thunder-mw backend name)
    and thunder-mw's hook as a callback; answers (proxy URL, thunder-mw admin URL)."""
    admin_port, port = free_port(), free_port()
    names = [f"sim-{i}" for i in range(len(engines))]
    thunder = {
        "backends": [{"name": n, "url": u} for n, u in zip(names, engines, strict=True)],
        "server": {"tick_interval_s": 0.1},
        "policies": [
            {"admission": {"overflow": "hold"}},
            {"state_aware_pause": {}},
            {"migration": {"prefer_home_backend": True}},
        ],
        "tools": {"docker": {"enabled": False}},
    }
    (tmp_path / "thunder-mw.yaml").write_text(yaml.safe_dump(thunder))
    (tmp_path / "thunder_hook.py").write_text(
        textwrap.dedent(
            f"""\
            from thunder_mw.cli.config_loader import load_config
            from thunder_mw.middleware.litellm_hook import ThunderScheduling

            thunder = ThunderScheduling(
                load_config({str(tmp_path / "thunder-mw.yaml")!r}), admin_port={admin_port}
            )
            """
        )
    )
    litellm_config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {"model": f"openai/{MODEL}", "api_base": f"{u}/v1"}
                | {"api_key": "unused"},
                "model_info": {"id": n},
            }
            for n, u in zip(names, engines, strict=True)
        ],
        "litellm_settings": {"callbacks": "thunder_hook.thunder"},
        "general_settings": {"master_key": MASTER_KEY},
    }
    config = tmp_path / "litellm.yaml"
    config.write_text(yaml.safe_dump(litellm_config))
    log = tmp_path / "litellm.log"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(config)]
    args += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    url, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
    with _process(args, log, env) as proc:
        _wait_for(f"{url}/health/liveliness", 120, log, proc)
        _wait_for(f"{admin}/health", 30, log, proc)
        yield url, admin


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp_path = tmp_path_factory.mktemp("litellm")
    with ExitStack() as stack:
        engines = [stack.enter_context(_sim_engine(free_port(), i, tmp_path)) for i in range(2)]
        yield stack.enter_context(_litellm_proxy(engines, tmp_path))


async def _program(client: openai.AsyncOpenAI, index: int) -> list[tuple[str, dict[str, Any]]]:
    """One agent program: STEPS calls whose prompt grows by the answer and a tool result,
    named by thunder-mw's `program_id` or by one of LiteLLM's own session fields."""
    name = f"prog-{index}"
    identity, headers = [
        ({"program_id": name}, {}),
        ({"litellm_session_id": name}, {}),
        ({}, {"x-litellm-session-id": name}),
        ({"metadata": {"session_id": name}}, {}),
    ][index % 4]
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are a coding agent. " * 20},
        {"role": "user", "content": f"task {index}: " + "fix the failing test " * 40},
    ]
    seen: list[tuple[str, dict[str, Any]]] = []
    for _ in range(STEPS):
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            max_tokens=16,
            extra_body=identity,
            extra_headers=headers,
        )
        answer = raw.parse()
        assert answer.usage is not None
        seen.append((raw.headers["x-litellm-model-id"], answer.usage.model_dump()))
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        await asyncio.sleep(TOOL_S)
        messages.append({"role": "user", "content": "tool output: ok " * 20})
    return seen


async def _programs(url: str) -> list[list[tuple[str, dict[str, Any]]]]:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=MASTER_KEY, timeout=120) as c:
        return await asyncio.gather(*(_program(c, i) for i in range(PROGRAMS)))


def _counter(admin: str, name: str) -> float:
    text = httpx.get(f"{admin}/metrics", timeout=10).text
    samples = [line for line in text.splitlines() if line.startswith(name)]
    return sum(float(line.rpartition(" ")[2]) for line in samples)


def test_the_scheduler_picks_the_deployment_and_holds_programs_under_overflow(
    proxy: tuple[str, str],
) -> None:
    url, admin = proxy
    runs = asyncio.run(_programs(url))

    programs = {p["program_id"]: p for p in httpx.get(f"{admin}/programs").json()["programs"]}
    assert sorted(programs) == sorted(f"prog-{i}" for i in range(PROGRAMS))
    for index, calls in enumerate(runs):
        program = programs[f"prog-{index}"]
        served = [deployment for deployment, _ in calls]
        # LiteLLM served every call on the deployment thunder-mw had placed the program on:
        # the deployment changes only where the scheduler moved the program, and the last
        # call ran where it is placed now. (How many programs move depends on the timing of
        # their tool gaps against the engines' load, so no count of them is asserted.)
        switches = sum(1 for a, b in itertools.pairwise(served) if a != b)
        assert switches <= program["migrations"], (index, calls, program["migrations"])
        assert served[-1] == program["backend"], (index, calls)
        assert program["steps"] == STEPS
        # LiteLLM's usage is what the scheduler counted.
        assert program["prompt_tokens"] == sum(u["prompt_tokens"] for _, u in calls)
        assert program["completion_tokens"] == sum(u["completion_tokens"] for _, u in calls)
    # More programs than the two engines hold: some were paused in their tool gaps and
    # resumed, and every one of them still finished all its steps (above).
    paused = [p for p in programs.values() if p["pauses"] > 0]
    assert paused, "no program was paused: the engines did not overflow"
    assert _counter(admin, "thunder_mw_pauses_total") >= len(paused)
    assert _counter(admin, "thunder_mw_resumes_total") > 0

    for name in programs:
        r = httpx.post(f"{admin}/programs/release", json={"program_id": name}, timeout=10)
        assert r.json()["released"] is True


def test_bad_agent_context_is_refused_by_the_proxy_with_the_field_named(
    proxy: tuple[str, str],
) -> None:
    url, _ = proxy
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "program_id": 7}
    auth = {"Authorization": f"Bearer {MASTER_KEY}"}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth, timeout=30)
    assert r.status_code == 400, r.text
    assert "program_id" in r.text


def test_a_streamed_call_ends_with_its_usage_counted(proxy: tuple[str, str]) -> None:
    url, admin = proxy

    async def stream() -> dict[str, Any]:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=MASTER_KEY) as client:
            chunks = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "stream please " * 10}],
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"program_id": "prog-stream"},
            )
            usage = None
            async for chunk in chunks:
                usage = chunk.usage or usage
            assert usage is not None
            return usage.model_dump()

    usage = asyncio.run(stream())
    program = httpx.get(f"{admin}/programs/prog-stream", timeout=10).json()
    assert program["steps"] == 1 and program["in_flight"] == 0
    assert program["completion_tokens"] == usage["completion_tokens"] == 8
    httpx.post(f"{admin}/programs/release", json={"program_id": "prog-stream"}, timeout=10)
