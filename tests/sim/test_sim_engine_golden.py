"""The engine's behaviour for a given seed is pinned: speed-ups must not move a single step.

A random but seeded stream of requests (shared prefixes, growing agent contexts, chunked
prefill, preemption, aborts, TTL pins, a host tier, streaming listeners) is stepped to the
end; the digest of every step's result, the counters and the final cache state was taken on
the code before the stepping loop was optimised (the fast paths must reproduce it exactly).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

import pytest

from thunder_mw.sim import engine as engine_module
from thunder_mw.sim.cost_model import StepCost
from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams, Sequence, Status
from thunder_mw.sim.kv_cache import BlockPoolPy
from thunder_mw.sim.kv_tier import KvTierPy

# EngineStats fields added after the digests were taken (tests/sim/test_sim_server.py).
ADDED_COUNTERS = frozenset(
    {
        "request_prefill_seconds",
        "request_prefill_kv_computed_tokens",
        "request_decode_seconds",
        "requests_timed",
        "inter_token_seconds",
        "inter_tokens",
    }
)
# A fixed cost (not a named profile): the digest pins the stepping, not the cost model.
COST = StepCost(
    a=5e-3, b=3e-5, c=3e-5, d=5e-8, kv_bytes_per_token=131_072, host_link_bytes_per_s=64e9
)


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, int]] = []

    def on_progress(self, seq: Sequence) -> None:
        self.events.append(("p", seq.request_id, seq.num_output))

    def on_finish(self, seq: Sequence) -> None:
        self.events.append(("f", seq.request_id, seq.num_output))


def _drive(seed: int, host: bool, pins: bool) -> str:
    rng = random.Random(seed)
    config = EngineConfig(
        num_blocks=700,
        block_size=16,
        max_num_seqs=48,
        max_num_batched_tokens=2048,
        max_model_len=16_384,
        seed=seed,
        host_kv_tokens=8192 if host else 0,
    )
    engine = Engine(config, [5, 6, 7], cost=COST)
    recorder = _Recorder()
    system = [rng.randrange(1, 50_000) for _ in range(700)]
    contexts: dict[str, list[int]] = {}
    out: list[Any] = []
    serial = 0
    latest: dict[str, Sequence] = {}
    for _ in range(6000):
        if rng.random() < 0.08 and len(contexts) < 40:
            pid = f"p{serial}"
            serial += 1
            contexts[pid] = system + [
                rng.randrange(1, 50_000) for _ in range(rng.randrange(50, 900))
            ]
        if contexts and rng.random() < 0.15:
            pid = rng.choice(sorted(contexts))
            ctx = contexts[pid]
            last = latest.get(pid)
            if len(ctx) < 7000 and (
                last is None or last.status in (Status.FINISHED, Status.ABORTED)
            ):
                ctx += [rng.randrange(1, 50_000) for _ in range(rng.randrange(1, 600))]
                params = SamplingParams(
                    max_tokens=rng.randrange(1, 400),
                    ignore_eos=rng.random() < 0.7,
                    kv_ttl_s=rng.choice([None, 0.5, 3.0]) if pins else None,
                )
                engine.advance(engine.now + rng.random() * 0.05)
                latest[pid] = engine.add_request(
                    f"{pid}#{serial}", list(ctx), params, recorder, rng.random() < 0.3, pid
                )
                serial += 1
            elif rng.random() < 0.3:
                del contexts[pid]
        live = sorted(
            s.request_id for s in latest.values() if s.status in (Status.WAITING, Status.RUNNING)
        )
        if rng.random() < 0.01 and live:
            engine.abort(rng.choice(live))
        result = engine.step()
        if result is None:
            continue
        out.append(
            (
                round(result.duration, 12),
                result.prefill_tokens,
                result.decode_seqs,
                result.decode_context,
                [(s.request_id, s.num_output, s.finish_reason) for s in result.finished],
                [s.request_id for s in result.progressed],
                result.preempted,
            )
        )
    while engine.has_work:
        engine.step()
    pool = engine.pool
    # The counters as the digests were taken: counters added since are left out (adding a
    # counter must not change how the engine steps; each new one has its own test).
    stats = engine.stats
    kept = (f for f in dataclasses.fields(stats) if f.name not in ADDED_COUNTERS)
    out.append(f"EngineStats({', '.join(f'{f.name}={getattr(stats, f.name)!r}' for f in kept)})")
    out.append((pool.free_queue(), [pool.hash_of(b) for b in range(pool.num_blocks)]))
    out.append(recorder.events)
    if engine.host_tier is not None:
        out.append(engine.host_tier.lru_order())
    return hashlib.sha256(repr(out).encode()).hexdigest()


@pytest.mark.parametrize(
    ("seed", "host", "pins", "digest"),
    [
        (0, False, False, "e45db89d15d276a16732e3937f27c27677963082f0f8dcc9dd4fd000241498a3"),
        (1, True, False, "f655bf5a8663c6a3153b85e728447f6835ce66c05e0ea84f3e5ad8d3592ba778"),
        (2, False, True, "ed85f3755df0fcbb3ed6f0ad78fec11fc87ee84567fda935b2a9e99df3bdf359"),
        (3, True, True, "0266cbc72a33c6d37c8f53e65c13c130272c8847253dd0781e334a270ae2c07e"),
    ],
)
@pytest.mark.parametrize("blocks", ["compiled", "python"])
def test_a_seeded_request_stream_steps_exactly_as_before(
    seed: int, host: bool, pins: bool, digest: str, blocks: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if blocks == "python":
        # The Python classes the compiled ones replace (THUNDER_MW_SIM_PYTHON_BLOCKS=1): the
        # engine's calls must suit both (it hands them its chains as int64 arrays).
        monkeypatch.setattr(engine_module, "BlockPool", BlockPoolPy)
        monkeypatch.setattr(engine_module, "KvTier", KvTierPy)
    assert _drive(seed, host, pins) == digest
