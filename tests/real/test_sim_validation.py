"""The simulator against the REAL vLLM CPU engine: same script, same prefix-cache hits, same
preemptions (the simulator's claim to behave like vLLM rests on this test)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
from support.real_vllm import RealVllm, parse_metrics

from thunder_mw.benchmarks.sim_validation import RunResult, Script, build_script, run_script
from thunder_mw.schemas.config import SimEngineSettings
from thunder_mw.sim.embedded import EmbeddedEngine
from thunder_mw.sim.tokenizer import FileTokenizer, RuleTokenizer


def _engine_settings(**engine: Any) -> SimEngineSettings:
    """A simulated engine scheduled as the real one is served (vLLM's CPU defaults for the
    API server: 2,048 batched tokens, 128 sequences; the fixture's 2,048-token model)."""
    return SimEngineSettings(
        max_num_batched_tokens=2048, max_num_seqs=128, max_model_len=2048, **engine
    )


def _run_both(real: RealVllm) -> tuple[RunResult, RunResult]:
    tok = FileTokenizer(str(real.tokenizer_json))
    script = build_script(tok.encode, tok.decode)
    settings = _engine_settings(
        num_blocks=real.num_blocks,
        block_size=real.block_size,
        model_name=real.model,
        tokenizer_file=str(real.tokenizer_json),
        profile="cpu-tiny",
    )

    async def main() -> tuple[RunResult, RunResult]:
        assert await asyncio.to_thread(real.reset_prefix_cache)
        log_start = real.log_offset()
        real_result = await run_script(
            real.url,
            real.model,
            script,
            real.metrics,
            real.reset_prefix_cache,
            lambda: real.requests_added_since(log_start),
        )
        return real_result, await _run_on_sim(settings, script)

    return asyncio.run(main())


async def _run_on_sim(
    settings: SimEngineSettings,
    script: Script,
    on_arrivals: Callable[[dict[str, float]], None] = lambda samples: None,
) -> RunResult:
    """The script on a simulated engine; `on_arrivals` sees /metrics (and /load's
    `server_load`) at each arrivals() call."""
    sim = EmbeddedEngine(settings)
    url = await sim.start()
    try:

        def metrics() -> dict[str, float]:
            return parse_metrics(httpx.get(f"{url}/metrics").text)

        def reset() -> bool:
            return bool(httpx.post(f"{url}/reset_prefix_cache").json()["success"])

        def arrivals() -> int:  # every request it took in is in the engine or done
            # /load's server_load counts the requests in the engine now; vLLM's waiting gauge
            # would not do: it is made after a step, and a paused engine takes none.
            samples = metrics()
            samples["server_load"] = httpx.get(f"{url}/load").json()["server_load"]
            on_arrivals(samples)
            return round(samples["server_load"] + samples.get("vllm:request_success_total", 0.0))

        return await run_script(url, settings.model_name, script, metrics, reset, arrivals)
    finally:
        await sim.stop()


def test_simulator_matches_the_real_vllm_engine(vllm_engine: RealVllm) -> None:
    real, sim = _run_both(vllm_engine)
    # Sequential turns: the eviction order is determined, so hits match request by request.
    assert sim.prompt_tokens == real.prompt_tokens
    assert sim.cached_tokens == real.cached_tokens
    assert sum(real.cached_tokens) > 0
    # Totals over the whole script, overflow included, within 5 %.
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        r, s = real.metrics_delta[name], sim.metrics_delta[name]
        assert abs(s - r) <= 0.05 * max(r, 1.0), (name, r, s)
    # The overflow, released at once into a paused engine, preempts in both (why: the comment
    # on the overflow turns in benchmarks/sim_validation.py).
    preemptions = {
        name: result.metrics_delta["vllm:num_preemptions_total"]
        for name, result in (("real", real), ("sim", sim))
    }
    assert preemptions["real"] > 0, preemptions
    assert preemptions["sim"] > 0, preemptions


def test_the_overflow_reaches_the_engine_before_any_of_it_runs() -> None:
    # run_script against the simulator alone (no real engine needed): when `arrivals()` first
    # counts the whole overflow, all of it waits in the paused engine and none of it runs.
    tok = RuleTokenizer()
    script = build_script(tok.encode, tok.decode)
    settings = _engine_settings(num_blocks=24, block_size=128, model_name="sim", profile="instant")
    at_release: list[dict[str, float]] = []

    def on_arrivals(samples: dict[str, float]) -> None:
        if not at_release and samples["server_load"] == len(script.overflow):
            at_release.append(samples)

    result = asyncio.run(_run_on_sim(settings, script, on_arrivals))
    assert at_release, "the overflow never waited in the engine all at once"
    assert at_release[0]["vllm:num_requests_running"] == 0  # so all of it is waiting
    assert result.metrics_delta["vllm:num_preemptions_total"] > 0
