"""The compiled chain hashing (sim/_kvblocks.c: chain_hashes, chain_cycle) against Python's
own hash((parent, tuple(block))), which is what the engine's block hashes are by definition:
random parents over int64's whole range, random ids over uint32's, any block size; and the
engine's chain for a prompt held as an int array (the C path) equal to the chain for the same
prompt held as a list (the Python loop), through the prompt, the block it ends in and the
answer's blocks."""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest

from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams
from thunder_mw.sim.kv_cache import ROOT_HASH
from thunder_mw.sim.native_blocks import ChainHashers, chain_hashers

EDGES = [0, 1, -1, -2, 2**61 - 2, 2**61 - 1, 2**61, -(2**61) + 1, -(2**61), 2**63 - 1, -(2**63)]


def _hashers() -> ChainHashers:
    hashers = chain_hashers()
    # Built by the editable install; CI must not fall back to the Python loop unnoticed.
    assert hashers is not None
    return hashers


def _python_chain(parent: int, blocks: list[tuple[int, ...]]) -> list[int]:
    out = []
    for block in blocks:
        parent = hash((parent, block))
        out.append(parent)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_chain_hashes_is_pythons_hash_of_parent_and_block(seed: int) -> None:
    rng = random.Random(seed)
    over_ids = _hashers().over_ids
    for trial in range(300):
        parent = EDGES[trial] if trial < len(EDGES) else rng.randrange(-(2**63), 2**63)
        bs = rng.randint(1, 17)
        n = rng.randint(0, 6)
        pick = [0, 1, 256, 65535, 93259, 2**31, 2**32 - 1]
        ids = array("I", [rng.choice([*pick, rng.randrange(2**32)]) for _ in range(bs * (n + 2))])
        start = bs * rng.randint(0, 1)
        stop = start + bs * n
        blocks = [tuple(ids[k : k + bs]) for k in range(start, stop, bs)]
        assert over_ids(parent, ids, start, stop, bs).tolist() == _python_chain(parent, blocks)


@pytest.mark.parametrize("seed", range(4))
def test_chain_cycle_is_the_chain_over_blocks_known_by_their_hashes(seed: int) -> None:
    rng = random.Random(seed)
    over_blocks = _hashers().over_blocks
    for trial in range(300):
        parent = EDGES[trial] if trial < len(EDGES) else rng.randrange(-(2**63), 2**63)
        m, bs = rng.randint(1, 9), rng.randint(1, 20)
        blocks = [tuple(rng.randrange(2**32) for _ in range(bs)) for _ in range(m)]
        own = array("q", map(hash, blocks))
        first, count = rng.randint(0, 50), rng.randint(0, 12)
        want = _python_chain(parent, [blocks[(first + j * bs) % m] for j in range(count)])
        assert over_blocks(parent, own, first, bs, count).tolist() == want


def test_bad_calls_are_refused_by_name() -> None:
    hashers = _hashers()
    ids = array("I", range(8))
    with pytest.raises(TypeError, match=r"array\('I'\)"):
        hashers.over_ids(0, list(range(8)), 0, 8, 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"array\('I'\)"):
        hashers.over_ids(0, array("H", range(8)), 0, 8, 4)
    for start, stop, bs in ((0, 6, 4), (0, 12, 4), (-4, 4, 4), (4, 0, 4), (0, 8, 0)):
        with pytest.raises(ValueError, match="not whole blocks"):
            hashers.over_ids(0, ids, start, stop, bs)
    with pytest.raises(OverflowError):
        hashers.over_ids(2**64, ids, 0, 8, 4)
    with pytest.raises(TypeError, match=r"array\('q'\)"):
        hashers.over_blocks(0, [1, 2], 0, 1, 1)  # type: ignore[arg-type]
    for lanes, first, step, count in ((array("q"), 0, 1, 1), (array("q", [1]), -1, 1, 1)):
        with pytest.raises(ValueError, match="block hashes"):
            hashers.over_blocks(0, lanes, first, step, count)


def _chain_of(prompt: Any, max_tokens: int, block_size: int) -> list[int]:
    config = EngineConfig(num_blocks=256, block_size=block_size, profile="instant")
    engine = Engine(config, [70001, 5, 93259])
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    seq = engine.add_request("r", prompt, params)
    engine.run_until_idle()
    hashes = list(seq.block_hashes)
    assert hashes, "the request cached nothing"
    return hashes


@pytest.mark.parametrize(("n", "out", "bs"), [(37, 50, 4), (40, 9, 4), (5, 30, 16), (64, 1, 16)])
def test_an_array_prompt_hashes_as_the_same_list_does(n: int, out: int, bs: int) -> None:
    ids = [(7919 * k) % 65536 for k in range(n)]
    chain = _chain_of(ids, out, bs)
    assert len(chain) == (n + out - 1) // bs  # every whole block computed (the last token isn't)
    assert _chain_of(array("I", ids), out, bs) == chain
    # And that chain is the definition: the prompt then the answer (computed tokens only).
    tokens = ids + [[70001, 5, 93259][j % 3] for j in range(out - 1)]
    blocks = [tuple(tokens[k : k + bs]) for k in range(0, len(tokens) - bs + 1, bs)]
    assert chain == _python_chain(ROOT_HASH, blocks)
