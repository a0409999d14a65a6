"""The scripted multi-turn workload that validates the simulator against the real vLLM engine.

The same script runs against both engines through /v1/completions with raw prompts (no chat
template between them): growing prompts, repeats after other programs' traffic, then more
concurrent context than the KV cache holds. Prompt lengths are measured with the model's
tokenizer, so the script is the same for any engine serving that tokenizer.

The overflow is queued in a paused engine and released at once (vLLM's dev-mode `/pause?mode=keep`
and `/resume`, which the simulator serves too). Sent straight away, its requests reached the real
engine 1.0-1.5 s after the first one in half the runs on a loaded 2-core host (the client's event
loop stalled for that long mid-send): over 700 decode steps of the tiny model at ~1 ms each. By
then the first request holds 15 of the 23 usable blocks, a newcomer needs 9 for its prompt, so
vLLM queues it until the first finishes and the two never collide (with every gap that long,
no pair does: the real engine's 0 preemptions in 3 of 4 runs on 2026-11-30). Paused, no step
runs (vLLM's scheduler gives a PAUSED_ALL step no token budget), so the release is the same on a
busy host as on an idle one.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = [
    "RunResult",
    "Script",
    "Turn",
    "all_at_once",
    "build_script",
    "program_text",
    "run_script",
]

_WORDS = (
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud "
    "forest ember quartz signal vector kernel socket thread buffer packet module branch "
    "commit merge rebase tensor matrix planner agent tool result error retry cache block"
).split()


def program_text(seed: int, n_tokens: int, encode: Any) -> str:
    """Text of about `n_tokens` tokens (at least that many), unique to `seed`."""
    rng = random.Random(seed)
    words: list[str] = [f"program{seed}"]
    text = ""
    while True:
        words.extend(rng.choice(_WORDS) + str(rng.randrange(100)) for _ in range(32))
        text = " ".join(words)
        if len(encode(text)) >= n_tokens:
            return text


@dataclass
class Turn:
    """One request: program `program`'s context cut to `context_tokens`, `max_tokens` out."""

    program: int
    context_tokens: int
    max_tokens: int = 4
    label: str = ""


@dataclass
class Script:
    sequential: list[Turn]
    overflow: list[Turn]  # released at once after a prefix-cache reset (run_script)
    texts: dict[int, str] = field(default_factory=dict)


def build_script(encode: Any, decode: Any) -> Script:
    """The validation script for a 24-block x 128-token engine (23 usable blocks, 2,944 tokens)."""
    seq = [
        Turn(1, 600, label="p1 first"),
        Turn(1, 750, label="p1 grows"),
        Turn(2, 700, label="p2 first"),
        Turn(3, 700, label="p3 first"),
        Turn(1, 900, label="p1 grows after others"),
        Turn(4, 900, label="p4 first: evicts the LRU tails"),
        Turn(2, 800, label="p2 again after eviction"),
        Turn(3, 760, label="p3 again after eviction"),
        Turn(1, 1000, label="p1 again"),
        Turn(5, 1200, label="p5 large"),
        Turn(4, 1000, label="p4 again"),
        Turn(2, 900, label="p2 third"),
        Turn(1, 1100, label="p1 fourth"),
        Turn(5, 1300, label="p5 again"),
    ]
    # Released together (see run_script), the first engine step admits two overflow calls:
    # 1,100 + 948 prompt tokens fill the 2,048-token budget, and each has room for its whole
    # prompt (9 blocks; vLLM's scheduler_reserve_full_isl) while the third does not (5 free).
    # Decoding, each grows to 1,900 tokens = 15 blocks: 30 > 23 usable, so a decode step finds
    # no free block and the newest running request is preempted; so again for the later pairs.
    overflow = [Turn(10 + i, 1100, max_tokens=800, label=f"overflow {i}") for i in range(6)]
    texts: dict[int, str] = {}
    for turn in seq + overflow:
        need = max(t.context_tokens for t in seq + overflow if t.program == turn.program)
        if turn.program not in texts:
            texts[turn.program] = program_text(turn.program, need, encode)
    script = Script(seq, overflow, {})
    # Cut each program's text at a token count, so every turn's prompt extends the previous.
    full_ids = {p: encode(t) for p, t in texts.items()}
    for i, turn in enumerate(seq + overflow):
        script.texts[i] = decode(full_ids[turn.program][: turn.context_tokens])
    return script


@dataclass
class RunResult:
    cached_tokens: list[int]  # per sequential request
    prompt_tokens: list[int]
    overflow_cached_tokens: list[int]
    metrics_delta: dict[str, float]


async def run_script(
    url: str, model: str, script: Script, metrics: Any, reset: Any, arrivals: Any
) -> RunResult:
    """Drive one engine through the script; `metrics()`, `reset()` and `arrivals()` are the
    engine's hooks (`arrivals()`: how many requests it has taken in so far, a running total)."""
    before = await asyncio.to_thread(metrics)
    cached: list[int] = []
    prompts: list[int] = []
    timeout = httpx.Timeout(120.0)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:

        async def send(i: int, turn: Turn) -> dict[str, Any]:
            body = {
                "model": model,
                "prompt": script.texts[i],
                "max_tokens": turn.max_tokens,
                "ignore_eos": True,
                "temperature": 0.0,
            }
            r = await client.post("/v1/completions", json=body)
            r.raise_for_status()
            usage: dict[str, Any] = r.json()["usage"]
            return usage

        for i, turn in enumerate(script.sequential):
            usage = await send(i, turn)
            cached.append((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            prompts.append(usage["prompt_tokens"])
        mid = await asyncio.to_thread(metrics)
        assert await asyncio.to_thread(reset), "prefix cache reset refused"
        n = len(script.sequential)
        results = await all_at_once(
            client, [send(n + j, turn) for j, turn in enumerate(script.overflow)], arrivals
        )
    after = await asyncio.to_thread(metrics)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    delta["sequential_prefix_cache_hits"] = mid.get(
        "vllm:prefix_cache_hits_total", 0.0
    ) - before.get("vllm:prefix_cache_hits_total", 0.0)
    overflow_cached = [
        (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for u in results
    ]
    return RunResult(cached, prompts, overflow_cached, delta)


async def all_at_once(
    client: httpx.AsyncClient,
    calls: list[Coroutine[Any, Any, dict[str, Any]]],
    arrivals: Any,
    timeout_s: float = 120.0,
) -> list[dict[str, Any]]:
    """Runs `calls` so that the engine's scheduler sees all of them before it runs any.

    The engine is paused with its queue kept (`/pause?mode=keep`: no step runs, new requests
    wait), the calls are sent, and once `arrivals()` has counted every one of them in the
    engine, `/resume` lets the scheduler take them in order as if they had come in one step.
    """
    try:
        paused = await client.post("/pause", params={"mode": "keep", "clear_cache": "false"})
        paused.raise_for_status()
    except BaseException:
        for call in calls:
            call.close()
        raise
    tasks: list[asyncio.Task[dict[str, Any]]] = []
    try:
        before = await asyncio.to_thread(arrivals)
        tasks = [asyncio.create_task(call) for call in calls]
        deadline = asyncio.get_running_loop().time() + timeout_s
        while await asyncio.to_thread(arrivals) - before < len(tasks):
            failed = [t for t in tasks if t.done()]  # answered while paused: an error
            if failed:
                await failed[0]
                raise RuntimeError("a request was answered while the engine was paused")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(
                    f"the engine did not take in {len(tasks)} requests in {timeout_s:.0f} s"
                )
            await asyncio.sleep(0.05)
    except BaseException:
        await client.post("/resume")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    (await client.post("/resume")).raise_for_status()
    return list(await asyncio.gather(*tasks))
