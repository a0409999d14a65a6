"""Paged KV blocks with vLLM v1's prefix cache: hash chains of full blocks, LRU free queue.

Mirrors `vllm/v1/core/block_pool.py` (vLLM 0.32) where it decides which tokens hit:
- block 0 is the null block and is never handed out, so `num_blocks - 1` are usable;
- only full blocks carry a hash, chained over the previous block's hash and this block's
  token ids;
- blocks no request holds stay cached in a free queue; allocation takes from its head and
  evicts the hash of the block it takes;
- freed blocks with a hash join the tail in the order given (callers free a request's
  blocks tail first, so a prompt's tail is evicted before its head); freed blocks without
  a hash go to the head, they are reused first.

`KvTier` is the host-memory (or disk) tier behind it, with the semantics of vLLM's
offloading connector, LMCache and SGLang HiCache (write-back): a full block evicted from the
GPU is stored there under its chain hash, LRU again; a block evicted from the host tier goes
to the tier below it (disk), if any. A later prefix hit on a stored block is loaded back
instead of recomputed; the copy stays in the tier (as the host copies of those engines do).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

BlockHash = int

ROOT_HASH: BlockHash = 0x74_68_75_6E_64_65_72  # any fixed int: the parent of a first block
# BlockPool.new_hashes is bounded: past this many, the epoch moves on instead.
NEW_HASHES_KEPT = 1 << 16


def chain_hash(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The hash of one full block given its parent's hash (None for the first block)."""
    return hash((ROOT_HASH if parent is None else parent, tuple(token_ids)))


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    known: list[BlockHash] | None = None,
) -> list[BlockHash]:
    """Hashes of every full block of `token_ids`, extending `known` (a prefix already hashed)."""
    out = known if known is not None else []
    parent = out[-1] if out else None
    for start in range(len(out) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash(
            (ROOT_HASH if parent is None else parent, tuple(token_ids[start : start + block_size]))
        )
        out.append(parent)
    return out


class KvTier:
    """A host-memory or disk KV store of full blocks, by chain hash, evicting LRU."""

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
        lower: KvTier | None = None,
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

    def load(self, block_hash: BlockHash) -> None:
        """A block read back to the GPU: it stays here, most recently used."""
        if block_hash in self._lru:
            self._lru.move_to_end(block_hash)
        self.loaded_blocks += 1

    def lru_order(self) -> list[BlockHash]:
        """Stored hashes, next evicted first; for tests and debugging."""
        return list(self._lru)

    def clear(self) -> None:
        self._lru.clear()
        if self.lower is not None:
            self.lower.clear()


class BlockPool:
    """All KV blocks of one engine: reference counts, cached hashes and the free queue."""

    __slots__ = (
        "_by_hash",
        "_dups",
        "_free",
        "_hash",
        "_ref",
        "block_size",
        "free_epoch",
        "new_hashes",
        "num_blocks",
        "tier",
    )

    def __init__(self, num_blocks: int, block_size: int, tier: KvTier | None = None) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        # Head = next to be reused. Block 0 is the null block, never free.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self._by_hash: dict[BlockHash, int] = {}
        # Two requests can fill identical blocks at once; vLLM keeps both under one hash.
        self._dups: dict[BlockHash, list[int]] = {}
        # Where evicted full blocks go (None: they are dropped, as in a stock engine).
        self.tier = tier
        # What can make a refused admission fit (see Engine._admit): blocks coming back to
        # the free queue (counted by `free_epoch`) and hashes becoming findable (listed in
        # `new_hashes` since the last epoch). Allocations, touches and evictions only ever
        # make it harder.
        self.free_epoch = 0
        self.new_hashes: list[BlockHash] = []

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    def usage(self) -> float:
        """Fraction of usable blocks held by requests (vLLM's kv_cache_usage_perc)."""
        return 1.0 - len(self._free) / (self.num_blocks - 1)

    def num_cached(self) -> int:
        """Blocks that carry a hash (held or free)."""
        return len(self._by_hash) + sum(len(v) for v in self._dups.values())

    def num_evictable_cached(self) -> int:
        """Free blocks that still hold a cached prefix."""
        h = self._hash
        return sum(1 for b in self._free if h[b] is not None)

    def longest_hit(self, hashes: Sequence[BlockHash], max_blocks: int) -> list[int]:
        """Blocks of the longest cached prefix, at most `max_blocks` long."""
        # The lookups run in C (map), in slices so that a short hit stops early.
        get = self._by_hash.get
        hit: list[int] = []
        end = min(max_blocks, len(hashes))
        start = 0
        step = 64
        while start < end:
            found: list[Any] = list(map(get, hashes[start : min(end, start + step)]))
            if None in found:
                hit += found[: found.index(None)]
                break
            hit += found
            start += step
            step *= 4
        return hit

    def num_evictable(self, blocks: Iterable[int]) -> int:
        """How many of `blocks` sit in the free queue (touching them uses free capacity)."""
        return list(map(self._ref.__getitem__, blocks)).count(0)

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def hash_of(self, block: int) -> BlockHash | None:
        return self._hash[block]

    def free_queue(self) -> list[int]:
        """The free queue, head (next reused) first; for tests and debugging."""
        return list(self._free)

    # -- changes ---------------------------------------------------------------------------
    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on cache-hit blocks, taking free ones off the free queue."""
        ref = self._ref
        free = self._free
        for b in blocks:
            r = ref[b]
            if not r:
                del free[b]
            ref[b] = r + 1

    def allocate(self, n: int) -> list[int]:
        """Take `n` blocks from the head of the free queue, evicting their cached hashes."""
        free = self._free
        if n > len(free):
            raise ValueError(f"cannot allocate {n} blocks, {len(free)} free")
        pop = free.popitem
        out = [pop(False)[0] for _ in range(n)]
        ref = self._ref
        hashes = self._hash
        for b in out:
            ref[b] = 1
        evicted = [b for b in out if hashes[b] is not None]
        if evicted:
            self._evict(evicted)
        return out

    def allocate_one(self) -> int:
        b = self._free.popitem(last=False)[0]
        if self._hash[b] is not None:
            self._evict((b,))
        self._ref[b] = 1
        return b

    def free(self, ordered: Iterable[int]) -> None:
        """Drop one reference per block; `ordered` lists blocks in the order to evict them."""
        ref = self._ref
        hashes = self._hash
        free = self._free
        self.free_epoch += 1
        self.new_hashes = []
        first: list[int] = []
        for b in ordered:
            r = ref[b] - 1
            ref[b] = r
            if not r:
                if hashes[b] is None:
                    first.append(b)
                else:
                    free[b] = None
        # Uncached blocks are reused first, in LIFO order like vLLM's prepend_n.
        for b in reversed(first):
            free[b] = None
            free.move_to_end(b, last=False)

    def cache(self, block: int, block_hash: BlockHash) -> None:
        """Register a full block's hash so later requests can hit it."""
        self.cache_range([block], [block_hash], 0, 1)

    def cache_range(
        self, blocks: Sequence[int], hashes: Sequence[BlockHash], start: int, end: int
    ) -> None:
        """`cache(blocks[i], hashes[i])` for i in [start, end), in that order."""
        own = self._hash
        by_hash = self._by_hash
        new = self.new_hashes
        for b, h in zip(blocks[start:end], hashes[start:end], strict=True):
            if own[b] is not None:
                continue
            own[b] = h
            if h in by_hash:
                self._dups.setdefault(h, []).append(b)
            else:
                by_hash[h] = b
                new.append(h)
        if len(new) >= NEW_HASHES_KEPT:
            self.free_epoch += 1  # forgets every refusal (Engine._admit): safe, only slower
            self.new_hashes = []

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, the tiers' too; refused (False) while any request holds
        blocks."""
        if len(self._free) != self.num_blocks - 1:
            return False
        self._hash = [None] * self.num_blocks
        self.free_epoch += 1
        self.new_hashes = []
        self._by_hash.clear()
        self._dups.clear()
        if self.tier is not None:
            self.tier.clear()
        return True

    def _evict(self, blocks: Iterable[int]) -> None:
        """Forget the hashes of blocks being reused (in order), storing them in the tier."""
        own = self._hash
        by_hash = self._by_hash
        tier = self.tier
        for b in blocks:
            h = own[b]
            assert h is not None
            if tier is not None:
                tier.store(h)
            own[b] = None
            if not self._dups:
                # No hash has two blocks: every cached block is its hash's entry.
                del by_hash[h]
            else:
                self._uncache_dup(b, h)

    def _uncache_dup(self, block: int, block_hash: BlockHash) -> None:
        if self._by_hash.get(block_hash) == block:
            dups = self._dups.get(block_hash)
            if dups:
                self._by_hash[block_hash] = dups.pop(0)
                if not dups:
                    del self._dups[block_hash]
            else:
                del self._by_hash[block_hash]
        else:
            dups = self._dups.get(block_hash, [])
            if block in dups:
                dups.remove(block)
                if not dups:
                    del self._dups[block_hash]

    def snapshot(self) -> dict[str, Any]:
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "free": len(self._free),
            "cached": self.num_cached(),
        }
