"""The host KV tier's LRU (sim/kv_tier.py) against a plain per-block OrderedDict LRU: the same
contents, order and counters after random runs of stores and loads, with a tier below. Any
faster tier (whole runs at once, stores kept pending) must pass these (issue 43)."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from thunder_mw.sim.kv_tier import KvTier, KvTierPy


class _ReferenceTier:
    """The tier block by block, as the simulator first had it."""

    def __init__(self, capacity: int, lower: _ReferenceTier | None = None) -> None:
        self.capacity = capacity
        self.lower = lower
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.stored = self.evicted = self.loaded = 0

    def store(self, h: int) -> None:
        if h in self.lru:
            self.lru.move_to_end(h)
            return
        if len(self.lru) >= self.capacity:
            old = self.lru.popitem(last=False)[0]
            self.evicted += 1
            if self.lower is not None:
                self.lower.store(old)
        self.lru[h] = None
        self.stored += 1

    def load(self, h: int) -> None:
        if h in self.lru:
            self.lru.move_to_end(h)
        self.loaded += 1

    def load_prefix(self, hs: list[int]) -> int:
        n = 0
        for h in hs:
            if h not in self.lru:
                break
            self.load(h)
            n += 1
        return n


def _state(tier: KvTier) -> tuple[list[int], int, int, int, int]:
    return (
        tier.lru_order(),
        tier.stored_blocks,
        tier.evicted_blocks,
        tier.loaded_blocks,
        len(tier),
    )


def _ref_state(tier: _ReferenceTier) -> tuple[list[int], int, int, int, int]:
    return (list(tier.lru), tier.stored, tier.evicted, tier.loaded, len(tier.lru))


# The tier the simulator runs (compiled where built) and the Python one it is checked against.
@pytest.mark.parametrize("tier_class", [KvTier, KvTierPy], ids=["KvTier", "KvTierPy"])
@pytest.mark.parametrize("seed", range(40))
def test_runs_of_stores_and_loads_match_a_per_block_lru(
    seed: int, tier_class: type[KvTier]
) -> None:
    rng = random.Random(seed)
    cap, disk_cap = rng.randint(1, 40), rng.randint(1, 60)
    with_disk = rng.random() < 0.5
    disk = tier_class("disk", disk_cap, 1.0) if with_disk else None
    tier = tier_class("host", cap, 1.0, disk)
    ref_disk = _ReferenceTier(disk_cap) if with_disk else None
    ref = _ReferenceTier(cap, ref_disk)
    universe = rng.randint(5, 120)  # few hashes: runs often hit blocks held, or evicted
    for _ in range(300):
        op = rng.random()
        if op < 0.3:
            h = rng.randrange(universe)
            tier.store(h)
            ref.store(h)
        elif op < 0.6:
            # A run of distinct hashes (an allocation's evictions), sometimes longer than
            # the tier, sometimes naming hashes at its head.
            run = rng.sample(range(universe), rng.randint(0, min(universe, 2 * cap)))
            tier.store_many(run)
            for h in run:
                ref.store(h)
        elif op < 0.8:
            run = [rng.randrange(universe) for _ in range(rng.randint(0, 3 * cap))]
            assert tier.load_prefix(run) == ref.load_prefix(run)
        elif op < 0.9:
            run = [rng.randrange(universe) for _ in range(rng.randint(0, cap))]
            tier.load_many(run)
            for h in run:
                ref.load(h)
        else:
            h = rng.randrange(universe)
            assert (h in tier) == (h in ref.lru)
        if rng.random() < 0.3:  # reads apply pending stores; sometimes let them pile up
            assert _state(tier) == _ref_state(ref)
            if disk is not None and ref_disk is not None:
                assert _state(disk) == _ref_state(ref_disk)
    assert _state(tier) == _ref_state(ref)
    if disk is not None and ref_disk is not None:
        assert _state(disk) == _ref_state(ref_disk)


def test_a_run_naming_a_hash_twice_stores_it_once_then_moves_it() -> None:
    tier = KvTier("host", 3, 1.0)
    tier.store_many([1, 2])
    tier.store_many([3, 4, 3])  # 4 evicts 1; the second 3 only moves
    assert tier.lru_order() == [2, 4, 3]
    assert (tier.stored_blocks, tier.evicted_blocks) == (4, 1)


def test_a_run_evicting_a_hash_it_names_later_stores_that_hash_anew() -> None:
    tier = KvTier("host", 2, 1.0)
    tier.store_many([1, 2])
    # 3 evicts 1 (the head) before 1's turn comes: 1 is stored again, evicting 2.
    tier.store_many([3, 1])
    assert tier.lru_order() == [3, 1]
    assert (tier.stored_blocks, tier.evicted_blocks) == (4, 2)


def test_what_the_host_evicts_is_in_the_disk_below_when_the_disk_is_read_first() -> None:
    disk = KvTier("disk", 4, 1.0)
    host = KvTier("host", 1, 1.0, disk)
    host.store(1)
    host.store(2)  # a tier that defers stores must apply them before either tier is read
    assert disk.lru_order() == [1]
    assert 1 in disk and len(host) == 1
