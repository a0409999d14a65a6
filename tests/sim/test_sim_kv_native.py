"""The compiled KV block pool and tier (sim/_kvblocks.c) against the Python ones they replace
(sim/kv_cache.BlockPoolPy, sim/kv_tier.KvTierPy): the same random calls, as the engine makes
them (prefix hits, allocations that evict into a host tier and a disk below it, blocks cached
twice under one hash, shared prefixes freed last, preemptions), give the same result from
every call and the same state after it: free queue, hashes, counters, each tier's LRU."""

from __future__ import annotations

import random
from array import array
from functools import reduce
from itertools import repeat
from operator import add
from typing import Any

import pytest

from thunder_mw.sim.kv_cache import BlockPool, BlockPoolPy
from thunder_mw.sim.kv_tier import KvTier, KvTierPy
from thunder_mw.sim.native_blocks import native_module, repeat_adder


def test_the_simulator_runs_the_compiled_classes() -> None:
    # Built by the editable install (pyproject.toml's ext-modules); without it the Python
    # classes run, many times slower: CI must not fall back without saying so.
    native = native_module()
    assert native is not None
    assert issubclass(BlockPool, native.BlockPool)
    assert issubclass(KvTier, native.KvTier)


def _pool_state(pool: Any) -> tuple[Any, ...]:
    return (
        pool.free_queue(),
        pool.num_free,
        pool.free_epoch,
        list(pool.new_hashes),
        pool.num_cached(),
        pool.num_evictable_cached(),
        [pool.hash_of(b) for b in range(pool.num_blocks)],
        pool.usage(),
        pool.snapshot(),
    )


def _tier_state(tier: Any) -> tuple[Any, ...]:
    if tier is None:
        return ()
    return (
        tier.lru_order(),
        tier.stored_blocks,
        tier.evicted_blocks,
        tier.loaded_blocks,
        len(tier),
        tier.usage(),
        _tier_state(tier.lower),
    )


class _Twin:
    """One pool of each kind, every call made on both and its results compared."""

    def __init__(
        self, rng: random.Random, num_blocks: int | None = None, tiers: bool = True
    ) -> None:
        self.num_blocks = num_blocks or rng.randint(2, 40)
        block_size = 4
        with_host, with_disk = tiers and rng.random() < 0.7, rng.random() < 0.4
        host_cap, disk_cap = rng.randint(1, 30), rng.randint(1, 50)
        self.tiers: list[Any] = []
        self.pools: list[Any] = []
        for tier_cls, pool_cls in ((KvTier, BlockPool), (KvTierPy, BlockPoolPy)):
            disk = tier_cls("disk", disk_cap, 2.0) if with_host and with_disk else None
            host = tier_cls("host", host_cap, 1000, disk) if with_host else None
            self.tiers.append(host)
            self.pools.append(pool_cls(self.num_blocks, block_size, host))

    def call(self, name: str, *args: Any) -> Any:
        results = []
        for pool in self.pools:
            try:
                results.append(("ok", getattr(pool, name)(*args)))
            except ValueError as exc:
                results.append(("ValueError", str(exc)))
        assert results[0] == results[1], (name, args)
        return results[0][1] if results[0][0] == "ok" else None

    def tier_call(self, name: str, *args: Any) -> Any:
        if self.tiers[0] is None:
            return None
        got = [getattr(t, name)(*args) for t in self.tiers]
        assert got[0] == got[1], (name, args)
        return got[0]

    def check(self) -> None:
        assert _pool_state(self.pools[0]) == _pool_state(self.pools[1])
        assert _tier_state(self.tiers[0]) == _tier_state(self.tiers[1])


def _as_engine_keeps(rng: random.Random, hashes: list[int]) -> Any:
    """The hashes as a list, or half the time as the engine keeps a chain: an int64 array,
    which the compiled classes read in place."""
    return array("q", hashes) if rng.random() < 0.5 else hashes


def _blocks_as_engine_keeps(rng: random.Random, blocks: list[int]) -> Any:
    """Block ids as a list, or half the time as the engine keeps a request's: an int32
    array, which the compiled pool reads in place."""
    return array("i", blocks) if rng.random() < 0.5 else blocks


def _chains(rng: random.Random) -> list[list[int]]:
    """A few hash chains, some sharing a first block or two (a system prompt); hashes as
    `hash()` makes them (64-bit, either sign) or small ints."""
    common = [hash(("system", i)) for i in range(3)]
    chains = []
    for c in range(rng.randint(1, 5)):
        shared = rng.randint(0, 3)
        own = [hash((c, i)) if rng.random() < 0.8 else c * 100 + i for i in range(14)]
        chains.append(common[:shared] + own[shared:])
    return chains


@pytest.mark.parametrize("seed", range(60))
def test_random_engine_calls_give_the_same_results_and_state(seed: int) -> None:
    _random_engine_calls(seed, 250)


@pytest.mark.parametrize("seed", range(100, 106))
def test_long_runs_of_calls_keep_the_free_queue_in_order(seed: int) -> None:
    # The compiled free queue is a log that a hit leaves stale entries in and that is
    # compacted when its ring fills (2x the blocks, at least 64 entries): thousands of calls
    # on a pool of a few dozen blocks fill it many times over.
    _random_engine_calls(seed, 3_000)


@pytest.mark.parametrize("num_blocks", [5, 40, 300])
def test_a_context_taken_and_freed_over_and_over_keeps_the_free_queue_in_order(
    num_blocks: int,
) -> None:
    # Each hit on free blocks leaves their old entries in the compiled queue's log, each
    # free puts them at its end again: the ring fills and is compacted many times, between
    # and during calls (a free may fill it), with allocations taking from the head between.
    rng = random.Random(num_blocks)
    twin = _Twin(rng, num_blocks, tiers=False)
    chain = [hash(("ctx", i)) for i in range(num_blocks - 1)]
    for round_ in range(40 * num_blocks):
        want = chain[: rng.randint(1, num_blocks - 1)]
        hit = twin.call("longest_hit", want, len(want))
        twin.call("touch", hit)
        new = twin.call("allocate", len(want) - len(hit))
        blocks = list(hit) + list(new or ())
        twin.call("cache_range", blocks, want, len(hit), len(blocks))
        one = twin.call("allocate_one") if round_ % 7 == 0 else None
        if one is not None:
            blocks.append(one)
        twin.call("free_request", blocks, len(want))
        twin.check()


def _random_engine_calls(seed: int, calls: int) -> None:
    rng = random.Random(seed)
    twin = _Twin(rng)
    chains = _chains(rng)
    held: list[tuple[list[int], int]] = []  # each request's blocks and how many carry a hash
    for _ in range(calls):
        op = rng.random()
        if op < 0.45:
            # A request's admission: hit, load from the tier, touch, allocate, cache.
            chain = rng.choice(chains)
            hashes = _as_engine_keeps(rng, chain[: rng.randint(1, len(chain))])
            likely = rng.choice(held)[0] if held and rng.random() < 0.5 else None
            hit = twin.call("longest_hit", hashes, rng.randint(0, len(hashes)), likely)
            twin.call("num_evictable", hit)
            twin.tier_call("load_prefix", hashes[len(hit) :])
            twin.call("touch", hit)
            blocks = list(hit)
            new = twin.call("allocate", len(hashes) - len(hit) + rng.randint(0, 2))
            blocks += new or []
            cached = len(hit)
            if new is not None:
                cached = rng.randint(len(hit), min(len(blocks), len(hashes)))
                form = _blocks_as_engine_keeps(rng, blocks)
                twin.call("cache_range", form, hashes, len(hit), cached)
            held.append((blocks, cached))
        elif op < 0.55 and held:
            # Two requests filling identical blocks at once: one hash, two blocks.
            blocks, cached = rng.choice(held)
            chain = rng.choice(chains)
            if len(blocks) > cached:
                end = min(len(blocks), len(chain))
                twin.call("cache_range", blocks, _as_engine_keeps(rng, chain), cached, end)
                held.remove((blocks, cached))
                held.append((blocks, min(len(blocks), len(chain))))
        elif op < 0.85 and held:
            blocks, cached = held.pop(rng.randrange(len(held)))
            how = rng.random()
            if how < 0.6:
                twin.call("free_request", _blocks_as_engine_keeps(rng, blocks), cached)
            elif how < 0.8:
                twin.call("free_cached", list(reversed(blocks[:cached])))
                twin.call("free", list(reversed(blocks[cached:])))
            else:
                twin.call("free", list(reversed(blocks)))
        elif op < 0.9 and held:
            blocks, _ = rng.choice(held)
            one = twin.call("allocate_one")
            if one is not None:
                blocks.append(one)
        elif op < 0.93:
            twin.call("reset_prefix_cache")
        elif op < 0.96:
            chain = rng.choice(chains)
            twin.tier_call("load_many", _as_engine_keeps(rng, chain[: rng.randint(0, len(chain))]))
            twin.tier_call("__contains__", rng.choice(chain))
        else:
            twin.call("allocate", twin.num_blocks + 1)  # refused, by name, on both
        twin.check()


def test_bad_calls_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        BlockPool(1, 4)
    with pytest.raises(ValueError, match="the host KV tier needs at least one block"):
        KvTier("host", 0, 1.0)
    with pytest.raises(ValueError, match="positive load speed"):
        KvTier("host", 4, 0.0)
    with pytest.raises(TypeError, match="KvTier"):
        BlockPool(4, 4, KvTierPy("host", 4, 1.0))
    pool = BlockPool(4, 4)
    with pytest.raises(IndexError, match="block 9"):
        pool.touch([9])
    for bad in (9, -1):  # read in place from an array: checked all the same
        with pytest.raises(IndexError, match=f"block {bad} is not in this pool"):
            pool.touch(array("i", [bad]))
        with pytest.raises(IndexError, match=f"block {bad} is not in this pool"):
            pool.free_request(array("i", [1, bad]), 1)
        with pytest.raises(IndexError, match=f"block {bad} is not in this pool"):
            pool.cache_range(array("i", [bad]), [7], 0, 1)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(ValueError, match=f"block {b} is freed but no request holds it"):
        pool.free([b])
    assert pool.num_free == 3  # nothing changed by the refused call


def test_hashes_read_alike_from_any_sequence_of_ints() -> None:
    # The engine hands its chains over as int64 arrays, read in place; a list, a tuple, a
    # strided view (not one piece: read as a sequence) give the same answers, on both pools.
    chain = [hash(("p", i)) for i in range(12)]
    forms: list[Any] = [
        chain,
        tuple(chain),
        array("q", chain),
        memoryview(array("q", [x for c in chain for x in (c, 0)]))[::2],
    ]
    for pool_cls, tier_cls in ((BlockPool, KvTier), (BlockPoolPy, KvTierPy)):
        answers = []
        for form in forms:
            tier = tier_cls("host", 20, 1.0)
            pool = pool_cls(16, 4, tier)
            blocks = pool.allocate(10)
            pool.cache_range(blocks, form, 0, 10)
            pool.free_request(blocks, 10)
            hit = pool.longest_hit(form, 12)
            pool.allocate(15)  # evicts every cached block into the tier
            answers.append((hit, list(pool.new_hashes), tier.load_prefix(form), tier.lru_order()))
        assert all(a == answers[0] for a in answers), pool_cls
        assert answers[0][0] and answers[0][2] == 10


def test_blocks_read_alike_from_any_sequence_of_ints() -> None:
    # The engine keeps a request's blocks as an int32 array, read in place; a list, a tuple,
    # an array of another width (read as a sequence) give the same answers, on both pools,
    # and both hand blocks back as int32 arrays.
    for pool_cls in (BlockPool, BlockPoolPy):
        answers = []
        for form in (list, tuple, lambda b: array("i", b), lambda b: array("q", b)):
            pool = pool_cls(16, 4)
            blocks = pool.allocate(10)
            assert isinstance(blocks, array) and blocks.typecode == "i"
            pool.cache_range(form(blocks), list(range(100, 110)), 0, 8)
            pool.touch(form(blocks[:2]))
            evictable = pool.num_evictable(form(blocks))
            pool.free_request(form(blocks), 8)
            pool.free(form(blocks[:2]))
            hit = pool.longest_hit(list(range(100, 110)), 10)
            answers.append((evictable, hit, pool.free_queue(), pool.num_free))
        assert all(a == answers[0] for a in answers), pool_cls
        assert len(answers[0][1]) == 8


@pytest.mark.parametrize("capacity", [3, 700, 5000])
def test_long_runs_of_moves_and_stores_keep_the_tier_in_lru_order(capacity: int) -> None:
    # The compiled tier keeps its LRU as a log that it rewrites when full (or grows, where
    # the blocks it holds fill half): thousands of moves on a small tier rewrite it again and
    # again; thousands of new blocks on a large one grow it.
    rng = random.Random(capacity)
    disk = [KvTier("disk", 2 * capacity, 1.0), KvTierPy("disk", 2 * capacity, 1.0)]
    host = [KvTier("host", capacity, 1.0, disk[0]), KvTierPy("host", capacity, 1.0, disk[1])]
    universe = 3 * capacity + 10
    for _ in range(40):
        run = _as_engine_keeps(rng, [rng.randrange(universe) for _ in range(rng.randint(0, 400))])
        if rng.random() < 0.5:
            for tier in host:
                tier.store_many(run)
        else:
            assert host[0].load_prefix(run) == host[1].load_prefix(run)
            for tier in host:
                tier.load_many(run[::-1])
        assert _tier_state(host[0]) == _tier_state(host[1])


def test_repeat_add_is_the_python_additions_one_at_a_time() -> None:
    # The engine's tier load time: k equal additions, each rounded, in order (no sum()).
    native = native_module()
    assert native is not None
    fast = repeat_adder()
    assert fast is native.repeat_add
    rng = random.Random(3)
    for _ in range(3000):
        start = rng.choice([0.0, rng.random() * 10 ** rng.randint(-9, 6)])
        x = rng.random() * 10 ** rng.randint(-9, 0)
        k = rng.randint(0, 2000)
        assert fast(start, x, k) == reduce(add, repeat(x, k), start)
    with pytest.raises(ValueError, match="-1 additions"):
        fast(0.0, 1.0, -1)
