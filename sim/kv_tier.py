"""The host-memory (or disk) KV tier behind a BlockPool: full blocks by chain hash, LRU.

It has the semantics of vLLM's offloading connector, LMCache and SGLang HiCache (write-back):
a full block evicted from the GPU is stored here under its chain hash, LRU again; a block
evicted from here goes to the tier below (disk), if any. A later prefix hit on a stored
block is loaded back instead of recomputed; the copy stays here (as the host copies of those
engines do), most recently used.

What runs is the compiled `KvTier` (sim/_kvblocks.c: the LRU as a log in a ring, read in
order when evicting) where the install built it; `KvTierPy` here is its specification.
Among Python layouts, an OrderedDict, block by block, measured faster than the alternatives
tried (issue 43, callgrind on a recorded replay of `swe-agent-knee` `offload`'s block
calls): whole runs as plain-dict operations in C, +8.6 % instructions (a dict's first key is
found past every entry deleted before it); stamps in a list with stale entries, slower
still; whole-run OrderedDict operations, +19 %. tests/sim/test_sim_kv_tier.py holds any
replacement to this per-block LRU. Where a segment-based LRU would pay (same replay): prefix
loads arrive in pieces of ~33 blocks that sit together in the LRU, stores of blocks already
here in pieces of ~166; but two thirds of the blocks stored are new, each one insert and one
eviction whatever the structure.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from thunder_mw.sim.native_blocks import pick

__all__ = ["KvTier", "KvTierPy"]

BlockHash = int

# Runs an iterator of calls to its end in C, keeping nothing.
_drain: Callable[[Iterable[Any]], None] = deque[Any](maxlen=0).extend


class KvTierPy:
    """A host-memory or disk KV store of full blocks, by chain hash, evicting LRU.

    The specification of the compiled `KvTier` (sim/_kvblocks.c), which runs where it was
    built (sim/native_blocks.py)."""

    __slots__ = (
        "_lru",
        "capacity_blocks",
        "evicted_blocks",
        "load_tokens_per_s",
        "loaded_blocks",
        "lower",
        "name",
        "stored_blocks",
    )

    def __init__(
        self,
        name: str,
        capacity_blocks: int,
        load_tokens_per_s: float,
        lower: KvTierPy | None = None,
    ) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"the {name} KV tier needs at least one block")
        if load_tokens_per_s <= 0:
            raise ValueError(f"the {name} KV tier needs a positive load speed (tokens/s)")
        self.name = name
        self.capacity_blocks = capacity_blocks
        self.load_tokens_per_s = load_tokens_per_s
        self.lower = lower
        self._lru: OrderedDict[BlockHash, None] = OrderedDict()  # head = next evicted
        self.stored_blocks = 0  # blocks written into this tier (GPU→host, host→disk)
        self.evicted_blocks = 0  # blocks dropped from this tier (to the lower one, if any)
        self.loaded_blocks = 0  # blocks loaded back to the GPU from this tier

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def usage(self) -> float:
        return len(self._lru) / self.capacity_blocks

    def store(self, block_hash: BlockHash) -> None:
        """Keep a block the tier above evicted; a copy already here becomes most recent."""
        lru = self._lru
        if block_hash in lru:
            lru.move_to_end(block_hash)
            return
        if len(lru) >= self.capacity_blocks:
            old = lru.popitem(last=False)[0]
            self.evicted_blocks += 1
            if self.lower is not None:
                self.lower.store(old)
        lru[block_hash] = None
        self.stored_blocks += 1

    def store_many(self, block_hashes: Iterable[BlockHash]) -> None:
        """`store` each, in order (one call for a whole allocation's evictions)."""
        lru = self._lru
        capacity = self.capacity_blocks
        move = lru.move_to_end
        popitem = lru.popitem
        n = len(lru)
        stored = 0
        gone: list[BlockHash] = []
        # Inserting first and evicting after is the same: the tier held `capacity` >= 1
        # blocks, so the head is never the hash just inserted. The counters are summed and
        # the evicted blocks passed to the tier below once, after the loop.
        for h in block_hashes:
            if h in lru:
                move(h)
                continue
            lru[h] = None
            stored += 1
            if n < capacity:
                n += 1
            else:
                gone.append(popitem(False)[0])
        self.stored_blocks += stored
        if gone:
            self.evicted_blocks += len(gone)
            if self.lower is not None:
                self.lower.store_many(gone)

    def load(self, block_hash: BlockHash) -> None:
        """A block read back to the GPU: it stays here, most recently used."""
        if block_hash in self._lru:
            self._lru.move_to_end(block_hash)
        self.loaded_blocks += 1

    def load_many(self, block_hashes: Sequence[BlockHash]) -> None:
        """`load` each, in order."""
        move = self._lru.move_to_end
        try:
            # The engine loads only blocks it found here: the moves run in C.
            _drain(map(move, block_hashes))
        except KeyError:
            # One is not here. Moving them all again, skipping those, ends in the same
            # order: the ones moved already go back to the tail in the same order.
            lru = self._lru
            for h in block_hashes:
                if h in lru:
                    move(h)
        self.loaded_blocks += len(block_hashes)

    def load_prefix(self, block_hashes: Sequence[BlockHash]) -> int:
        """`load_many` of the longest run of `block_hashes`, from the first, that this tier
        holds; its length. One pass in C: a move fails on the first hash not held."""
        lru = self._lru
        move = lru.move_to_end
        n = len(block_hashes)
        start = 0
        step = 16  # in growing slices: the hashes past the run are not looked at
        while start < n:
            part = block_hashes[start : start + step]
            try:
                _drain(map(move, part))
            except KeyError:
                # Those before it moved (and are still held): the run ends at the first not.
                start += list(map(lru.__contains__, part)).index(False)
                break
            start += len(part)
            step *= 4
        self.loaded_blocks += start
        return start

    def lru_order(self) -> list[BlockHash]:
        """Stored hashes, next evicted first; for tests and debugging."""
        return list(self._lru)

    def clear(self) -> None:
        self._lru.clear()
        if self.lower is not None:
            self.lower.clear()


if TYPE_CHECKING:
    KvTier = KvTierPy
else:
    KvTier = pick(KvTierPy, "KvTier")
