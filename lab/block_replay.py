"""Record a DES run's KV-block calls, then replay them alone: timed, and checked call by call.

python -m thunder_mw.lab.block_replay record SCENARIO:POLICY[:SEED] calls.pkl
python -m thunder_mw.lab.block_replay check calls.pkl   # every result and pool state equal?
python -m thunder_mw.lab.block_replay time calls.pkl    # CPU seconds of the calls alone

Issue 43: in a tiered run most of the time is the simulated engine's block work
(sim/kv_cache.BlockPool, sim/kv_tier.KvTier). Replaying just those calls times a change to
them in seconds rather than a whole run, without the scheduler's share diluting it, and
`check` compares each call's result and the pool's counts (free blocks, free epoch, new
hashes; the tier's size) with the recording, then prints a digest of the final state (free
queue, every block's hash, each tier's LRU order and counters): a faster pool or tier must
print the digest the code that recorded the file prints. The file holds a copy of every
argument, so it is large (500 MB for `swe-agent-knee:offload`); a prefix of its list replays
as well (`--calls N`), as the calls only ever depend on those before them.
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from thunder_mw.sim import kv_cache, kv_tier

__all__ = ["final_digest", "main", "record", "recording", "replay", "replay_log"]

# The calls the engine makes, by class; internal calls (a tier's own `store`) are not
# recorded, they replay as the recorded ones make them.
POOL_CALLS = (
    "allocate",
    "allocate_one",
    "cache_range",
    "free_cached",
    "free_request",
    "longest_hit",
    "num_evictable",
    "reset_prefix_cache",
    "touch",
)
TIER_CALLS = ("__contains__", "load_many", "load_prefix")

Entry = tuple[Any, ...]


def _copy(value: Any) -> Any:
    """A copy of an argument or result as it is now (the engine extends lists it passed)."""
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value] if isinstance(value, list) else tuple(map(_copy, value))
    if value is None or isinstance(value, int | float | str):
        return value
    return list(value)  # an iterable of blocks


def _state(obj: Any) -> Any:
    if isinstance(obj, kv_cache.BlockPool):
        return (obj.num_free, obj.free_epoch, len(obj.new_hashes))
    return len(obj)


@contextmanager
def recording() -> Iterator[list[Entry]]:
    """Within it, every BlockPool and KvTier built, and every call the engine makes on
    them, is appended to the list it yields."""
    log: list[Entry] = []
    ids: dict[int, int] = {}
    patched: list[tuple[type, str, Any]] = []

    def patch(cls: type, name: str, wrapper: Callable[..., Any]) -> None:
        patched.append((cls, name, getattr(cls, name)))
        setattr(cls, name, wrapper)

    pool_init = kv_cache.BlockPool.__init__
    tier_init = kv_tier.KvTier.__init__

    def new_pool(self: Any, num_blocks: int, block_size: int, tier: Any = None) -> None:
        pool_init(self, num_blocks, block_size, tier)
        ids[id(self)] = len(ids)
        below = None if tier is None else ids[id(tier)]
        log.append(("pool", ids[id(self)], (num_blocks, block_size, below)))

    def new_tier(self: Any, name: str, blocks: int, speed: float, lower: Any = None) -> None:
        tier_init(self, name, blocks, speed, lower)
        ids[id(self)] = len(ids)
        below = None if lower is None else ids[id(lower)]
        log.append(("tier", ids[id(self)], (name, blocks, speed, below)))

    def logged(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Any, *args: Any) -> Any:
            copied = tuple(map(_copy, args))
            result = method(self, *args)
            log.append((name, ids[id(self)], copied, _copy(result), _state(self)))
            return result

        return call

    patch(kv_cache.BlockPool, "__init__", new_pool)
    patch(kv_tier.KvTier, "__init__", new_tier)
    for cls, names in ((kv_cache.BlockPool, POOL_CALLS), (kv_tier.KvTier, TIER_CALLS)):
        for name in names:
            patch(cls, name, logged(name, getattr(cls, name)))
    try:
        yield log
    finally:
        for cls, name, original in reversed(patched):
            setattr(cls, name, original)


def record(spec: str, path: Path) -> int:
    """Run SCENARIO:POLICY[:SEED]'s main point with every pool and tier call logged to
    `path`; the number of entries."""
    from thunder_mw.benchmarks import bench_cli

    with recording() as log:
        scenario, jobs, seed = bench_cli.main_jobs(spec)
        bench_cli.run_job(scenario, jobs[0], None, seed)
    with path.open("wb") as fh:
        pickle.dump(log, fh, protocol=5)
    return len(log)


def final_digest(objs: Iterable[Any]) -> str:
    """A digest of pools' and tiers' whole state, in the order given."""
    final: list[Any] = []
    for obj in objs:
        if isinstance(obj, kv_tier.KvTier):
            counters = (obj.stored_blocks, obj.evicted_blocks, obj.loaded_blocks)
            final.append((obj.name, obj.lru_order(), counters))
        else:
            hashes = [obj.hash_of(b) for b in range(obj.num_blocks)]
            final.append((obj.free_queue(), hashes, obj.new_hashes))
    return hashlib.sha256(repr(final).encode()).hexdigest()[:16]


def replay(path: Path, check: bool, calls: int | None = None) -> tuple[float, int, str]:
    """Replay the file's first `calls` entries (all: None) on fresh pools and tiers: CPU
    seconds of the calls, how many differ from the recording (0 unless `check`), and the
    digest of the final state (`final_digest`)."""
    with path.open("rb") as fh:
        log: list[Entry] = pickle.load(fh)
    return replay_log(log[:calls] if calls is not None else log, check)


def replay_log(log: list[Entry], check: bool) -> tuple[float, int, str]:
    """`replay` of a log in memory."""
    objs: dict[int, Any] = {}
    differ = 0
    started = time.process_time()
    for at, entry in enumerate(log):
        kind, oid, args = entry[0], entry[1], entry[2]
        if kind == "tier":
            name, blocks, speed, below = args
            objs[oid] = kv_tier.KvTier(name, blocks, speed, objs.get(below))
        elif kind == "pool":
            num_blocks, block_size, below = args
            objs[oid] = kv_cache.BlockPool(num_blocks, block_size, objs.get(below))
        else:
            obj = objs[oid]
            result = getattr(obj, kind)(*args)
            if check and (_copy(result) != entry[3] or _state(obj) != entry[4]):
                differ += 1
                if differ <= 5:
                    print(f"differs: entry {at} {kind} on {oid}", file=sys.stderr)
    seconds = time.process_time() - started
    return seconds, differ, final_digest(obj for _, obj in sorted(objs.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("record", "check", "time"))
    parser.add_argument("args", nargs="+", help="record: SPEC FILE; check, time: FILE")
    parser.add_argument("--calls", type=int, default=None, help="replay only the first N")
    ns = parser.parse_args(argv)
    if ns.action == "record":
        spec, path = ns.args
        print(f"{record(spec, Path(path))} entries")
        return 0
    seconds, differ, digest = replay(Path(ns.args[0]), ns.action == "check", ns.calls)
    print(f"{seconds:.2f} s CPU, {differ} calls differ, final state {digest}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
