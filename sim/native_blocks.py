"""Which KV block classes the simulator runs: the compiled ones (sim/_kvblocks.c) where they
were built, else the Python ones they are checked against (sim/kv_cache.BlockPoolPy,
sim/kv_tier.KvTierPy). Both give the same results call by call
(tests/sim/test_sim_kv_native.py); the compiled ones are many times faster.

THUNDER_MW_SIM_PYTHON_BLOCKS=1 runs the Python ones even where the compiled ones exist (to
time or check one against the other on a whole run).

The same module's two helpers for the engine, each taken only where it gives what the Python
it stands for gives on samples here: the chain of block hashes (`chain_hashers`, Python's
hash() of (parent, block); sim/kv_cache.block_hashes starts its chains at ROOT_HASH only)
and a run of equal float additions (`repeat_adder`).
"""

from __future__ import annotations

import importlib
import os
from array import array
from collections.abc import Callable
from functools import reduce
from itertools import repeat
from operator import add
from types import ModuleType
from typing import Any, NamedTuple

__all__ = [
    "PYTHON_BLOCKS_ENV",
    "ChainHashers",
    "RepeatAdd",
    "chain_hashers",
    "native_module",
    "pick",
    "repeat_adder",
]

PYTHON_BLOCKS_ENV = "THUNDER_MW_SIM_PYTHON_BLOCKS"


def native_module() -> ModuleType | None:
    """The compiled module, or None (not built here, or the Python classes asked for)."""
    if os.environ.get(PYTHON_BLOCKS_ENV, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("thunder_mw.sim._kvblocks")
    except ImportError:
        return None


def pick(python_class: type[Any], name: str) -> type[Any]:
    """The class named `name` to run: a subclass of the compiled one (a Python class, so
    lab/block_replay.py can wrap its methods) or `python_class` itself."""
    native = native_module()
    if native is None:
        return python_class
    return type(
        name,
        (getattr(native, name),),
        {"__slots__": (), "__doc__": python_class.__doc__, "__module__": python_class.__module__},
    )


class ChainHashers(NamedTuple):
    """The compiled module's chain hashing: each block's hash((parent, tuple(block))), the one
    before as its parent, for whole blocks of token ids (`over_ids(parent, ids, start, stop,
    block_size)`: ids an array('I')) or for blocks known by their own hashes (`over_blocks(
    parent, block_hashes, first, step, count)`: block j's is block_hashes[(first + j * step)
    % len]). Both return an array('q')."""

    over_ids: Callable[[int, array[int], int, int, int], array[int]]
    over_blocks: Callable[[int, array[int], int, int, int], array[int]]


# Sample parents for the check below: the edges of int64 and of hash()'s modulus 2**61 - 1.
_PARENTS = (0, 1, -1, -2, 2**61 - 2, 2**61 - 1, 2**61, -(2**61), 2**63 - 1, -(2**63), 7**22)


def chain_hashers() -> ChainHashers | None:
    """The compiled chain hashing, where it reproduces this interpreter's hash() of (parent,
    tuple of ids) on sample blocks (it is CPython's arithmetic, written out); else None, and
    the engine hashes its blocks in Python."""
    native = native_module()
    if native is None or not hasattr(native, "chain_hashes"):
        return None
    hashers = ChainHashers(native.chain_hashes, native.chain_cycle)
    for n, first in enumerate(_PARENTS):
        bs = 1 + n % 5
        ids = array("I", [(first * 31 + 17 * k) % 2**32 for k in range(3 * bs)])
        ids[0], ids[-1] = 0, 2**32 - 1
        blocks = [tuple(ids[k * bs : (k + 1) * bs]) for k in range(3)]
        want, parent = [], first
        for block in blocks:
            parent = hash((parent, block))
            want.append(parent)
        own = array("q", [hash(block) for block in reversed(blocks)])
        if (
            hashers.over_ids(first, ids, 0, len(ids), bs).tolist() != want
            or hashers.over_blocks(first, own, 2, 2, 3).tolist() != want  # offsets 2, 1, 0
        ):
            return None
    return hashers


# repeat_add(start, x, k): start + x + ... + x, k additions one at a time, in that order.
RepeatAdd = Callable[[float, float, int], float]


def _repeat_add(start: float, x: float, k: int) -> float:
    # In C: the same additions in the same order (sum() would not do: it compensates
    # rounding on newer Pythons).
    return reduce(add, repeat(x, k), start)


def repeat_adder() -> RepeatAdd:
    """The compiled module's `repeat_add` where it gives the Python additions' result on
    sample sums, else those additions (functools.reduce over k floats)."""
    native = native_module()
    fast: RepeatAdd | None = getattr(native, "repeat_add", None)
    if fast is None:
        return _repeat_add
    for start, x, k in ((0.0, 0.1, 1000), (1e6, 3e-7, 777), (0.3, 1e-9, 5), (2.5, 0.7, 0)):
        if fast(start, x, k) != _repeat_add(start, x, k):
            return _repeat_add
    return fast
