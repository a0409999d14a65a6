"""Specification of the simulator's host KV tier: evicted full blocks go to host memory (LRU),
a later prefix hit loads them at the tier's speed instead of recomputing them."""

from __future__ import annotations

import pytest

from thunder_mw.sim.cost_model import StepCost
from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams
from thunder_mw.sim.kv_cache import KvTier

BS = 4
# 1 ms per step, 1 ms per prefill token: recompute is visible in step time.
COST = StepCost(a=1e-3, b=1e-3, c=0.0, d=0.0)
LOAD = 400.0  # tokens/s: one 4-token block loads in 10 ms


def _engine(num_blocks: int = 7, host_tokens: int = 64, **kw: object) -> Engine:
    cfg = EngineConfig(
        num_blocks=num_blocks,
        block_size=BS,
        profile="instant",
        host_kv_tokens=host_tokens,
        host_load_tokens_per_s=LOAD,
        **kw,  # type: ignore[arg-type]
    )
    return Engine(cfg, [7, 8, 9], COST)


def _run(engine: Engine, rid: str, prompt: list[int], out: int = 1):  # type: ignore[no-untyped-def]
    seq = engine.add_request(rid, prompt, SamplingParams(max_tokens=out, ignore_eos=True))
    durations = []
    while engine.has_work:
        result = engine.step()
        assert result is not None
        durations.append(result.duration)
    return seq, durations


A = list(range(100, 120))  # 20 tokens: 4 full blocks are hashed (the last token never is)
B = list(range(200, 220))


def test_evicted_full_blocks_go_to_the_host_tier() -> None:
    engine = _engine(num_blocks=7)  # 6 usable blocks, all of them A's after it ran
    _run(engine, "a", A)
    assert engine.host_tier is not None and len(engine.host_tier) == 0
    # B takes 5 blocks: A's partial last block first, then its full blocks tail first; A's
    # first block stays on the GPU.
    _run(engine, "b", B)
    assert len(engine.host_tier) == 4
    assert engine.host_tier.stored_blocks == 4


def test_a_prefix_hit_on_host_blocks_loads_them_instead_of_recomputing() -> None:
    engine = _engine(num_blocks=7)
    _run(engine, "a", A)
    _run(engine, "b", B)
    again, durations = _run(engine, "a2", [*A, 1, 2, 3])
    # A's first block is still on the GPU; the next four come back from the host tier.
    assert again.num_cached_tokens == 20 and again.num_loaded_tokens == 16
    st = engine.stats
    assert st.kv_load_tokens == 16
    # vLLM's connector counters: every request's tokens past its GPU hit are looked up.
    assert st.external_prefix_cache_queries == 20 + 20 + (23 - 4)
    assert st.external_prefix_cache_hits == 16
    assert st.cached_by_source == {"device": 4, "host": 16}
    # The admitting step pays the load (4 blocks x 10 ms) and prefills only the 3 new tokens.
    assert durations[0] == pytest.approx(COST.a + 3 * COST.b + 16 / LOAD)


def test_without_a_host_tier_the_same_request_recomputes() -> None:
    engine = _engine(num_blocks=7, host_tokens=0)
    _run(engine, "a", A)
    _run(engine, "b", B)
    again, durations = _run(engine, "a2", [*A, 1, 2, 3])
    assert again.num_cached_tokens == 4
    assert durations[0] == pytest.approx(COST.a + 19 * COST.b)


def test_the_host_tier_evicts_its_least_recently_used_block() -> None:
    tier = KvTier("host", capacity_blocks=2, load_tokens_per_s=1.0)
    tier.store(1)
    tier.store(2)
    tier.load(1)  # 1 becomes most recent
    tier.store(3)  # evicts 2
    assert tier.lru_order() == [1, 3]
    assert tier.evicted_blocks == 1


def test_a_block_the_host_evicts_goes_to_the_disk_tier_below() -> None:
    disk = KvTier("disk", capacity_blocks=4, load_tokens_per_s=1.0)
    host = KvTier("host", capacity_blocks=1, load_tokens_per_s=1.0, lower=disk)
    host.store(1)
    host.store(2)
    assert host.lru_order() == [2] and disk.lru_order() == [1]


def test_a_small_host_tier_keeps_the_last_evicted_blocks_the_head_of_the_prompt() -> None:
    engine = _engine(num_blocks=7, host_tokens=2 * BS)  # 2 host blocks
    _run(engine, "a", A)
    _run(engine, "b", B)
    assert engine.host_tier is not None and engine.host_tier.evicted_blocks == 2
    # The GPU evicts a prompt tail first, so the 2-block tier ends with blocks 2 and 3 of A:
    # the prefix continues from the GPU's block 1 into them, and stops at block 4.
    again, _ = _run(engine, "a2", [*A, 1])
    assert again.num_cached_tokens == 12 and again.num_loaded_tokens == 8


def test_disk_tier_hits_load_at_the_disk_speed() -> None:
    engine = _engine(
        num_blocks=7,
        host_tokens=BS,  # one host block
        disk_kv_tokens=64,
        disk_load_tokens_per_s=40.0,  # 100 ms per block
    )
    _run(engine, "a", A)
    _run(engine, "b", B)
    again, durations = _run(engine, "a2", [*A, 1])
    # GPU: block 1; host: block 2 (evicted last); disk: blocks 3-5, pushed down by the host.
    assert engine.stats.cached_by_source == {"device": 4, "host": 4, "disk": 12}
    assert again.num_loaded_tokens == 16
    assert durations[0] == pytest.approx(COST.a + 1 * COST.b + 4 / LOAD + 12 / 40.0)


def test_a_host_tier_needs_a_load_speed_when_the_profile_has_none() -> None:
    cfg = EngineConfig(num_blocks=7, block_size=BS, profile="cpu-tiny", host_kv_tokens=64)
    with pytest.raises(ValueError, match="host_load_tokens_per_s"):
        Engine(cfg, [7])


def test_a_gpu_profile_gives_the_host_tier_its_pcie_speed() -> None:
    cfg = EngineConfig(num_blocks=64, block_size=16, profile="h100-8b", host_kv_tokens=1024)
    engine = Engine(cfg, [7])
    assert engine.host_tier is not None
    # 64 GB/s over Llama-3-8B's 128 KiB per token.
    assert engine.host_tier.load_tokens_per_s == pytest.approx(64e9 / 131072)


def test_resetting_the_prefix_cache_empties_the_host_tier() -> None:
    engine = _engine(num_blocks=7)
    _run(engine, "a", A)
    _run(engine, "b", B)
    assert engine.reset_prefix_cache()
    assert len(engine.host_tier or ()) == 0
