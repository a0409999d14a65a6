"""Specification of the simulator's paged KV cache: vLLM v1's prefix cache and eviction order."""

from __future__ import annotations

from typing import Any

from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams
from thunder_mw.sim.kv_cache import BlockPool, block_hashes

BS = 4


def _engine(num_blocks: int = 12, **kw: Any) -> Engine:
    return Engine(EngineConfig(num_blocks=num_blocks, block_size=BS, profile="instant", **kw), [7])


def _run(engine: Engine, prompt: list[int], max_tokens: int = 1) -> int:
    seq = engine.add_request(
        str(id(prompt)) + str(engine.step_no),
        prompt,
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )
    engine.run_until_idle()
    return seq.num_cached_tokens


def test_block_zero_is_the_null_block_and_never_handed_out() -> None:
    pool = BlockPool(5, BS)
    assert pool.num_free == 4
    assert 0 not in pool.allocate(4)


def test_only_full_blocks_are_hashed() -> None:
    assert len(block_hashes(list(range(11)), BS)) == 2


def test_a_prefix_ending_inside_a_block_hits_only_its_full_blocks() -> None:
    engine = _engine()
    _run(engine, list(range(1, 11)))  # 10 tokens: blocks [1-4] [5-8] cached, [9,10] partial
    assert _run(engine, [*range(1, 10), 99, 98, 97]) == 8


def test_the_last_prompt_token_is_never_a_hit() -> None:
    engine = _engine()
    prompt = list(range(1, 13))  # exactly three full blocks
    _run(engine, prompt)
    assert _run(engine, prompt) == 8  # the third block holds the last token: recomputed


def test_freed_blocks_keep_their_prefix_until_evicted() -> None:
    engine = _engine()
    _run(engine, list(range(1, 10)))
    assert engine.pool.usage() == 0.0
    assert _run(engine, list(range(1, 10))) == 8


def test_a_requests_tail_is_evicted_before_its_head() -> None:
    pool = BlockPool(8, BS)
    a, b, c = pool.allocate(3)
    for blk, h in zip((a, b, c), (11, 12, 13), strict=True):
        pool.cache(blk, h)
    pool.free(reversed([a, b, c]))
    # The four never-used blocks come first, then the tail c, then b, then the head a.
    assert pool.free_queue()[-3:] == [c, b, a]


def test_uncached_blocks_are_reused_before_cached_ones() -> None:
    pool = BlockPool(6, BS)
    cached, partial = pool.allocate(2)
    pool.cache(cached, 42)
    pool.free([partial, cached])
    assert pool.free_queue()[0] == partial
    assert pool.free_queue()[-1] == cached


def test_eviction_takes_the_least_recently_freed_prefix_first() -> None:
    engine = _engine(num_blocks=9)  # 8 usable blocks = 32 tokens
    old = list(range(100, 113))  # 13 tokens: 3 cached blocks + 1 partial
    new = list(range(200, 213))
    _run(engine, old)
    _run(engine, new)
    # Needs 4 blocks: the two uncached ones, then old's tail blocks (least recently freed).
    _run(engine, list(range(300, 313)))
    assert _run(engine, new) == 12
    assert _run(engine, old) == 4  # only old's head block survived


def test_a_hit_on_a_free_block_takes_it_off_the_free_queue() -> None:
    engine = _engine()
    prompt = list(range(1, 10))
    _run(engine, prompt)
    seq = engine.add_request("again", prompt, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    held = set(seq.blocks[:2])
    assert held.isdisjoint(engine.pool.free_queue())
    assert seq.num_cached_tokens == 8
