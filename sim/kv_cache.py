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

`BlockPool` is the compiled pool (sim/_kvblocks.c) where the install built it, else
`BlockPoolPy` below, its specification (sim/native_blocks.py picks).

`KvTier` (sim/kv_tier.py) is the host-memory (or disk) tier behind it: a full block evicted
from the GPU is stored there under its chain hash, LRU again, and loaded back on a later
prefix hit instead of recomputed.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import compress, repeat
from operator import eq, not_
from typing import TYPE_CHECKING, Any, cast

from thunder_mw.sim.kv_tier import KvTier
from thunder_mw.sim.native_blocks import pick

__all__ = [
    "NEW_HASHES_KEPT",
    "ROOT_HASH",
    "BlockHash",
    "BlockPool",
    "BlockPoolPy",
    "KvTier",
    "block_hashes",
]

BlockHash = int

ROOT_HASH: BlockHash = 0x74_68_75_6E_64_65_72  # any fixed int: the parent of a first block
# BlockPool.new_hashes is bounded: past this many, the epoch moves on instead.
NEW_HASHES_KEPT = 1 << 16
# A reference count that means "in the free queue" (BlockPool._ref: <= 0), for map().
_IS_FREE = (1).__gt__
_NOT_ONE = (1).__ne__


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


class _Run:
    """Blocks one `BlockPool.free` call put in the free queue, in queue order."""

    __slots__ = ("blocks", "live", "pos", "stamp")

    def __init__(self, blocks: list[int], stamp: int) -> None:
        self.blocks = blocks
        self.stamp = stamp
        self.live = len(blocks)  # of blocks[pos:], those still free since this run
        self.pos = 0  # blocks before it were handed out


class BlockPoolPy:
    """All KV blocks of one engine: reference counts, cached hashes and the free queue.

    The specification of the compiled `BlockPool` (sim/_kvblocks.c), which runs where it
    was built (sim/native_blocks.py): the same results and the same free queue, call by call.

    The free queue is the LRU order of vLLM's. An OrderedDict of free blocks did it, but a
    long simulation moves tens of millions of blocks through it, and a hit on free blocks
    deleting them from the middle of an OrderedDict cost more than the rest of the engine.
    The queue is kept lazily instead, as runs: the blocks each `free` call put there
    (`_Run`), in order. A free block's `_ref` entry is minus the stamp of the run it is
    live in (a held block's is its reference count, > 0); a hit only sets the reference
    count and the run's count of live blocks, its entry goes stale. Handing out blocks walks
    the head run past stale entries and drops runs with none live whole, so a program's
    previous context, taken back by its next request, costs nothing to skip. The live
    entries are exactly the OrderedDict's, in its order.
    """

    __slots__ = (
        "_by_hash",
        "_dups",
        "_entries",
        "_hash",
        "_num_free",
        "_queue",
        "_ref",
        "_runs",
        "_stamp",
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
        # > 0: references held; <= 0: free, minus its run's stamp. Block 0 is the null
        # block, never free: it holds a reference nobody drops.
        self._ref = [0] * num_blocks
        self._ref[0] = 1
        self._hash: list[BlockHash | None] = [None] * num_blocks
        # Head = next to be reused.
        first = _Run(list(range(1, num_blocks)), 0)
        self._queue: deque[_Run] = deque([first])
        self._runs: dict[int, _Run] = {0: first}  # the queue's runs by stamp
        self._stamp = 0  # the latest run's
        self._entries = num_blocks - 1  # Σ len(run.blocks) over the queue (its memory)
        self._num_free = num_blocks - 1
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
        return self._num_free

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    def usage(self) -> float:
        """Fraction of usable blocks held by requests (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self._num_free / (self.num_blocks - 1)

    @property
    def num_new_hashes(self) -> int:
        """len(new_hashes), without copying them (the compiled pool keeps them as int64s)."""
        return len(self.new_hashes)

    def new_hashes_since(self, k: int) -> array[BlockHash]:
        """new_hashes[k:], as int64s."""
        return array("q", self.new_hashes[k:])

    def num_cached(self) -> int:
        """Blocks that carry a hash (held or free)."""
        return len(self._by_hash) + sum(len(v) for v in self._dups.values())

    def num_evictable_cached(self) -> int:
        """Free blocks that still hold a cached prefix."""
        h = self._hash
        return sum(1 for b in self.free_queue() if h[b] is not None)

    def longest_hit(
        self, hashes: Sequence[BlockHash], max_blocks: int, likely: Sequence[int] | None = None
    ) -> array[int]:
        """Blocks of the longest cached prefix, at most `max_blocks` long. `likely`: blocks
        that probably still hold the first hashes (what the program's previous request or
        this one before its preemption held): where they do, the answer is theirs without
        a lookup by hash (a cold dict probe per block was a tenth of a long simulation)."""
        end = min(max_blocks, len(hashes))
        start = 0
        hit: list[int] = []
        step = 64
        if likely and end:
            step = 16
            # likely[i] is the answer at i iff it still holds hashes[i] and no other block
            # does (a duplicate could be the one the dict names). In C, in slices as below.
            own = self._hash.__getitem__
            m = min(len(likely), end)
            while start < m:
                stop = min(m, start + step)
                # Compared element by element: `hashes` may be a list or an int64 array.
                same = list(map(eq, map(own, likely[start:stop]), hashes[start:stop]))
                if False in same:
                    start += same.index(False)
                    break
                start = stop
                step *= 4
            if start and self._dups and not self._dups.keys().isdisjoint(hashes[:start]):
                start = 0
            hit = list(likely[:start])
            # Where they stop, the block was reused or the context is new: the dict rarely
            # has the next hash, so start small.
            step = 4
        # The lookups run in C (map), in slices so that a short hit stops early.
        get = self._by_hash.get
        while start < end:
            found: list[Any] = list(map(get, hashes[start : min(end, start + step)]))
            if None in found:
                hit += found[: found.index(None)]
                break
            hit += found
            start += step
            step *= 4
        return array("i", hit)

    def num_evictable(self, blocks: Iterable[int]) -> int:
        """How many of `blocks` sit in the free queue (touching them uses free capacity)."""
        return sum(map(_IS_FREE, map(self._ref.__getitem__, blocks)))

    def hash_of(self, block: int) -> BlockHash | None:
        return self._hash[block]

    def free_queue(self) -> list[int]:
        """The free queue, head (next reused) first; for tests and debugging."""
        ref = self._ref
        return [
            b
            for run in self._queue
            if run.live
            for b in run.blocks[run.pos :]
            if ref[b] == -run.stamp
        ]

    # -- changes ---------------------------------------------------------------------------
    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on cache-hit blocks, taking free ones off the free queue (their
        entries go stale, their runs count them out)."""
        ref = self._ref
        runs = self._runs
        taken = 0
        # Free blocks of a hit mostly come in long stretches of one run (the program's
        # previous request freed them together): count a stretch, then tell its run.
        last = 1  # no free block's
        stretch = 0
        for b in blocks:
            r = ref[b]
            if r > 0:
                ref[b] = r + 1
                continue
            ref[b] = 1
            if r == last:
                stretch += 1
                continue
            if stretch:
                runs[-last].live -= stretch
                taken += stretch
            last = r
            stretch = 1
        if stretch:
            runs[-last].live -= stretch
            taken += stretch
        self._num_free -= taken

    def _pop_free(self) -> int:
        """The block at the head of the free queue, taken off it with one reference."""
        queue = self._queue
        run = queue[0]
        while not run.live:
            self._drop_head()
            run = queue[0]
        blocks = run.blocks
        ref = self._ref
        tag = -run.stamp
        i = run.pos
        b = blocks[i]
        while ref[b] != tag:
            i += 1
            b = blocks[i]
        run.pos = i + 1
        run.live -= 1
        ref[b] = 1
        return b

    def _drop_head(self) -> None:
        """Drop the head run (no live block left in it)."""
        run = self._queue.popleft()
        del self._runs[run.stamp]
        self._entries -= len(run.blocks)

    def allocate(self, n: int) -> array[int]:
        """Take `n` blocks from the head of the free queue, evicting their cached hashes."""
        if n > self._num_free:
            raise ValueError(f"cannot allocate {n} blocks, {self._num_free} free")
        queue = self._queue
        ref = self._ref
        out: list[int] = []
        need = n
        while need:
            run = queue[0]
            if not run.live:
                self._drop_head()
                continue
            take = min(need, run.live)
            blocks = run.blocks
            i = run.pos
            if run.live == len(blocks) - i:
                # No stale entry left in this run: the next `take` are all live.
                out += blocks[i : i + take]
                i += take
            else:
                tag = -run.stamp
                left = take
                while left:
                    b = blocks[i]
                    i += 1
                    if ref[b] == tag:
                        out.append(b)
                        left -= 1
            run.pos = i
            run.live -= take
            need -= take
        self._num_free -= n
        hashes = self._hash
        if self._dups:
            for b in out:
                ref[b] = 1
            evicted = [b for b in out if hashes[b] is not None]
            if evicted:
                self._evict(evicted)
            return array("i", out)
        # `_evict` in the same pass (no hash has two blocks: each is its hash's entry).
        by_hash = self._by_hash
        gone: list[BlockHash] = []
        for b in out:
            ref[b] = 1
            h = hashes[b]
            if h is not None:
                del by_hash[h]
                hashes[b] = None
                gone.append(h)
        if gone and self.tier is not None:
            self.tier.store_many(gone)
        return array("i", out)

    def allocate_one(self) -> int:
        if not self._num_free:
            raise ValueError("cannot allocate 1 block, 0 free")
        b = self._pop_free()
        self._num_free -= 1
        h = self._hash[b]
        if h is not None:
            if self._dups:
                self._evict((b,))
            else:
                # `_evict` of one block, without its lists.
                del self._by_hash[h]
                self._hash[b] = None
                if self.tier is not None:
                    self.tier.store(h)
        return b

    def free(self, ordered: Iterable[int]) -> None:
        """Drop one reference per block; `ordered` lists blocks in the order to evict them."""
        hashes = self._hash
        cached: list[int] = []
        uncached: list[int] = []
        for b in ordered:
            (uncached if hashes[b] is None else cached).append(b)
        self._release(cached, uncached)

    def free_cached(self, ordered: Sequence[int]) -> None:
        """`free(ordered)` for blocks that all carry a hash (the hashes need not be read)."""
        self._release(list(ordered), [])

    def free_request(self, blocks: Sequence[int], num_cached: int) -> None:
        """`free(reversed(blocks))` for a request's blocks of which exactly the first
        `num_cached` carry a hash (as a request's do: hits, then blocks it filled and
        registered, then ones it has not): the hashes need not be read."""
        tail = list(blocks[num_cached:])
        tail.reverse()
        head = list(blocks[:num_cached])
        head.reverse()
        self._release(head, tail)

    def _release(self, cached: list[int], uncached: list[int]) -> None:
        """Drop a reference on each block: those of `cached` that it frees join the tail of
        the free queue in that order, those of `uncached` (no hash) its head."""
        self.free_epoch += 1
        self.new_hashes = []
        back = self._freed(cached)
        first = self._freed(uncached) if uncached else None
        if back is not None:
            self._queue.append(back)
        # Uncached blocks are reused first, in LIFO order like vLLM's prepend_n.
        if first is not None:
            self._queue.appendleft(first)
        if self._entries > 2 * self.num_blocks + 1024:
            self._compact()

    def _freed(self, blocks: list[int]) -> _Run | None:
        """Drop a reference on each of `blocks`; the run of those it frees (None: none)."""
        self._stamp += 1
        stamp = self._stamp
        tag = -stamp
        ref = self._ref
        out: list[int]
        refs = list(map(ref.__getitem__, blocks))
        ones = refs.count(1)
        if ones == len(refs):
            out = blocks  # the usual case: no other request holds any of them
        elif refs[:ones].count(1) == ones:
            # Others hold only the last ones: a shared prefix (a system prompt), freed last.
            out = blocks[:ones]
            for b, r in zip(blocks[ones:], refs[ones:], strict=True):
                ref[b] = r - 1
        else:
            # Some others hold too (a shared system prompt): split them off in C.
            shared = list(map(_NOT_ONE, refs))
            out = list(compress(blocks, map(not_, shared)))
            for b, r in zip(compress(blocks, shared), compress(refs, shared), strict=True):
                ref[b] = r - 1
        for b in out:
            ref[b] = tag
        if not out:
            return None
        run = _Run(out, stamp)
        self._runs[stamp] = run
        self._num_free += len(out)
        self._entries += len(out)
        return run

    def _compact(self) -> None:
        """Drop runs with no live block and the stale entries of the others (memory only:
        the live entries and their order stay)."""
        ref = self._ref
        runs = self._runs
        kept: deque[_Run] = deque()
        entries = 0
        for run in self._queue:
            if not run.live:
                del runs[run.stamp]
                continue
            blocks = run.blocks[run.pos :]
            if len(blocks) > run.live:
                blocks = list(
                    compress(blocks, map(eq, map(ref.__getitem__, blocks), repeat(-run.stamp)))
                )
            run.blocks = blocks
            run.pos = 0
            entries += len(blocks)
            kept.append(run)
        self._queue = kept
        self._entries = entries

    def cache(self, block: int, block_hash: BlockHash) -> None:
        """Register a full block's hash so later requests can hit it."""
        self.cache_range([block], [block_hash], 0, 1)

    def cache_range(
        self, blocks: Sequence[int], hashes: Sequence[BlockHash], start: int, end: int
    ) -> None:
        """`cache(blocks[i], hashes[i])` for i in [start, end), in that order."""
        own = self._hash
        setdefault = self._by_hash.setdefault
        mine = blocks[start:end]
        part = hashes[start:end]
        if len(mine) != len(part):  # an error, raised as before: after caching what pairs
            self._cache_each(zip(mine, part, strict=True))
            return
        # Usually every block is new and its hash too (five million a long run): those are
        # counted, not appended one by one, until the first that is not.
        pairs = zip(mine, part, strict=True)
        plain = 0
        for b, h in pairs:
            if own[b] is not None:
                dup = False  # it keeps its hash: skipped
                break
            own[b] = h
            # One probe: b is no entry's block (it had no hash), so the entry is b iff new.
            if setdefault(h, b) is not b:
                dup = True
                break
            plain += 1
        else:
            self.new_hashes += part
            self._bound_new_hashes()
            return
        self.new_hashes += part[:plain]
        if dup:
            self._dups.setdefault(part[plain], []).append(mine[plain])
        self._cache_each(pairs)

    def _cache_each(self, pairs: Iterable[tuple[int, BlockHash]]) -> None:
        """`cache_range`, block by block."""
        own = self._hash
        by_hash = self._by_hash
        new = self.new_hashes
        for b, h in pairs:
            if own[b] is not None:
                continue
            own[b] = h
            # One probe: b is no entry's block (it had no hash), so the entry is b iff new.
            if by_hash.setdefault(h, b) is b:
                new.append(h)
            else:
                self._dups.setdefault(h, []).append(b)
        self._bound_new_hashes()

    def _bound_new_hashes(self) -> None:
        if len(self.new_hashes) >= NEW_HASHES_KEPT:
            self.free_epoch += 1  # forgets every refusal (Engine._admit): safe, only slower
            self.new_hashes = []

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, the tiers' too; refused (False) while any request holds
        blocks."""
        if self._num_free != self.num_blocks - 1:
            return False
        self._hash = [None] * self.num_blocks
        self.free_epoch += 1
        self.new_hashes = []
        self._by_hash.clear()
        self._dups.clear()
        if self.tier is not None:
            self.tier.clear()
        return True

    def _evict(self, blocks: Sequence[int]) -> None:
        """Forget the hashes of blocks being reused (in order), storing them in the tier."""
        own = self._hash
        by_hash = self._by_hash
        tier = self.tier
        if not self._dups:
            # No hash with two blocks: every cached block is its hash's entry (and every
            # block evicted has a hash).
            hs = cast("list[BlockHash]", list(map(own.__getitem__, blocks)))
            for b, gone in zip(blocks, hs, strict=True):
                del by_hash[gone]
                own[b] = None
            if tier is not None:
                tier.store_many(hs)
            return
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
            "free": self._num_free,
            "cached": self.num_cached(),
        }


if TYPE_CHECKING:
    BlockPool = BlockPoolPy
else:
    BlockPool = pick(BlockPoolPy, "BlockPool")
