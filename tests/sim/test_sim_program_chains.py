"""A fleet's engines share programs' hash chains: a moved program is not hashed again."""

from __future__ import annotations

from array import array
from collections.abc import Callable

import pytest

from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams, Sequence, TokenIds
from thunder_mw.sim.kv_cache import block_hashes
from thunder_mw.sim.program_chains import ProgramChains

BS = 4
FILLER = [7, 8, 9]


def _engine(chains: ProgramChains[Sequence], seed: int = 0) -> Engine:
    config = EngineConfig(num_blocks=64, block_size=BS, profile="instant", seed=seed)
    return Engine(config, FILLER, chains=chains)


def _as_list(ids: list[int]) -> TokenIds:
    return ids


def _as_array(ids: list[int]) -> TokenIds:
    return array("I", ids)  # how the DES holds its prompts


@pytest.mark.parametrize("kind", [_as_list, _as_array])
def test_a_program_moved_to_another_engine_starts_from_the_chain_it_left(
    kind: Callable[[list[int]], TokenIds],
) -> None:
    chains = ProgramChains[Sequence](BS, FILLER, limit=8)
    first, second = _engine(chains), _engine(chains, seed=1)
    prompt = list(range(1, 31))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    seq = first.add_request("p#0", kind(prompt), params, program_id="p")
    first.run_until_idle()
    context = prompt + first.output_ids(seq) + [40, 41, 42, 43, 44]
    chain = seq.block_hashes
    nxt = second.add_request("p#1", kind(context), SamplingParams(max_tokens=2), program_id="p")
    assert nxt.block_hashes is chain  # handed over, not hashed again
    # Kept through the answer too: the prompt's 30 tokens and the 5 answer tokens computed
    # (the last is sampled, never computed) are 8 whole blocks; the prompt alone, 7.
    assert len(nxt.block_hashes) == (len(prompt) + 5) // BS
    assert nxt._likely is None  # the blocks it held are the other engine's
    second.run_until_idle()
    assert list(nxt.block_hashes[: len(context) // BS]) == block_hashes(context, BS)


def test_engines_that_hash_differently_cannot_share_chains() -> None:
    with pytest.raises(ValueError, match="block size and filler"):
        Engine(
            EngineConfig(block_size=8, profile="instant"),
            FILLER,
            chains=ProgramChains(BS, FILLER, 8),
        )
    with pytest.raises(ValueError, match="block size and filler"):
        Engine(
            EngineConfig(block_size=BS, profile="instant"), [1], chains=ProgramChains(BS, FILLER, 8)
        )


def test_the_oldest_program_is_forgotten_past_the_limit() -> None:
    chains = ProgramChains[Sequence](BS, FILLER, limit=2)
    engine = _engine(chains)
    for pid in ("a", "b", "c"):
        engine.add_request(
            f"{pid}#0", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1), program_id=pid
        )
    later = engine.add_request("a#1", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=1))
    assert chains.swap("a", later) is None
    assert chains.swap("c", later) is not None


def test_a_prompt_as_an_int_array_is_answered_as_the_same_list_is() -> None:
    # The natural length is keyed by the prompt's values, not by what holds them.
    engine = _engine(ProgramChains[Sequence](BS, FILLER, limit=8))
    for n in (1, 5, 9, 40):
        ids = [(7919 * k) % 90001 for k in range(n)]
        params = SamplingParams(max_tokens=300)
        assert engine.target_length(array("I", ids), params) == engine.target_length(ids, params)
