"""Specification of the simulated engine's scheduler: batching, preemption, recompute, output."""

from __future__ import annotations

from typing import Any

import pytest

from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams, Status

BS = 4


def _engine(num_blocks: int = 12, **kw: Any) -> Engine:
    cfg = EngineConfig(num_blocks=num_blocks, block_size=BS, profile="instant", **kw)
    return Engine(cfg, [7, 8, 9])


def _params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def test_each_step_decodes_one_token_for_every_running_sequence() -> None:
    engine = _engine(num_blocks=40)
    seqs = [engine.add_request(str(i), [i + 1] * 5, _params(10)) for i in range(3)]
    engine.step()  # prefill: first token of all three
    engine.step()
    engine.step()
    for seq in seqs:
        engine._materialize(seq, engine.step_no)
        assert seq.num_output == 3


def test_prefill_is_chunked_to_the_token_budget() -> None:
    engine = _engine(num_blocks=40, max_num_batched_tokens=8)
    seq = engine.add_request("a", list(range(1, 21)), _params(1))
    result = engine.step()
    assert result is not None and result.prefill_tokens == 8
    assert seq.num_computed == 8
    assert engine.run_until_idle() == 2  # 8 + 4 more tokens, then done


def test_no_more_than_max_num_seqs_run_at_once() -> None:
    engine = _engine(num_blocks=40, max_num_seqs=2)
    for i in range(3):
        engine.add_request(str(i), [i + 1] * 3, _params(5))
    engine.step()
    assert (engine.num_running, engine.num_waiting) == (2, 1)


def test_the_waiting_gauge_counts_only_what_the_last_schedule_left_waiting() -> None:
    # vLLM's num_requests_waiting is made after each step: a burst the next step takes in is
    # never seen waiting, a request that does not fit is.
    engine = _engine(num_blocks=40, max_num_seqs=2)
    for i in range(3):
        engine.add_request(str(i), [i + 1] * 3, _params(5))
    assert (engine.num_waiting, engine.waiting_after_schedule) == (3, 0)
    engine.step()
    assert (engine.num_waiting, engine.waiting_after_schedule) == (1, 1)
    engine.run_until_idle()
    assert (engine.num_waiting, engine.waiting_after_schedule) == (0, 0)


def test_the_newest_running_sequence_is_preempted_when_blocks_run_out() -> None:
    engine = _engine(num_blocks=7)  # 6 usable blocks = 24 tokens
    old = engine.add_request("old", [1] * 7, _params(12))
    new = engine.add_request("new", [2] * 7, _params(12))
    while engine.stats.num_preemptions == 0:
        engine.step()
    assert new.status is Status.WAITING and new.num_preemptions == 1
    assert old.status is Status.RUNNING


def test_a_preempted_sequence_is_recomputed_and_still_finishes_whole() -> None:
    engine = _engine(num_blocks=7)
    a = engine.add_request("a", [1] * 7, _params(12))
    b = engine.add_request("b", [2] * 7, _params(12))
    engine.run_until_idle()
    assert engine.stats.num_preemptions >= 1
    assert (a.num_output, b.num_output) == (12, 12)
    assert b.finish_reason == "length"
    assert engine.stats.preempted_prefix_cache_queries > 7  # its output joined its prompt
    assert engine.pool.num_free == engine.pool.num_usable


def test_a_recomputed_sequence_reuses_its_own_cached_blocks() -> None:
    engine = _engine(num_blocks=9)
    engine.add_request("a", [1] * 9, _params(14))
    b = engine.add_request("b", [2] * 9, _params(14))
    engine.run_until_idle()
    assert b.num_preemptions >= 1
    assert engine.stats.preempted_prefix_cache_hits > 0


def test_admission_needs_room_for_the_whole_prompt() -> None:
    engine = _engine(num_blocks=7, max_num_batched_tokens=4)
    engine.add_request("a", [1] * 16, _params(30))
    engine.step()
    engine.add_request("b", [2] * 16, _params(1))
    for _ in range(4):
        engine.step()
    assert engine.num_waiting == 1  # a holds 5 of 6 blocks; b's 4 do not fit


def test_ignore_eos_generates_exactly_max_tokens() -> None:
    engine = _engine()
    seq = engine.add_request("a", [1, 2, 3], _params(9))
    engine.run_until_idle()
    assert seq.num_output == 9 and seq.finish_reason == "length"


def test_without_ignore_eos_the_length_is_deterministic_and_min_tokens_holds() -> None:
    lengths = []
    for _ in range(2):
        engine = _engine(num_blocks=200)
        seq = engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=500, min_tokens=40))
        engine.run_until_idle()
        lengths.append(seq.num_output)
    assert lengths[0] == lengths[1] >= 40


def test_output_is_the_filler_repeated() -> None:
    engine = _engine()
    seq = engine.add_request("a", [1, 2], _params(5))
    engine.run_until_idle()
    assert engine.output_ids(seq) == [7, 8, 9, 7, 8]


def test_usage_counts_cached_prompt_tokens_of_a_repeat() -> None:
    engine = _engine()
    engine.add_request("a", list(range(1, 10)), _params(2))
    engine.run_until_idle()
    seq = engine.add_request("b", list(range(1, 10)), _params(2))
    engine.run_until_idle()
    assert seq.num_cached_tokens == 8
    assert engine.stats.prefix_cache_hits == 8 and engine.stats.prefix_cache_queries == 18


def test_step_time_follows_the_cost_model() -> None:
    engine = Engine(EngineConfig(num_blocks=40, block_size=BS, profile="h100-8b"), [7])
    engine.add_request("a", [1] * 10, _params(3))
    result = engine.step()
    assert result is not None
    # Ten prefill tokens attend to 1 + 2 + ... + 10 = 55 keys.
    assert result.prefill_positions == 55
    assert result.duration == engine.cost.step_seconds(10, 0, 0, 55)
    result = engine.step()
    assert result is not None
    assert result.duration == engine.cost.step_seconds(0, 1, 11)


def test_a_step_pays_the_per_request_cost_for_each_request_it_takes_in() -> None:
    # StepCost.f: the fixed work a CPU engine does for a new request (fit_cpu_profile.py).
    from thunder_mw.sim.cost_model import StepCost

    cost = StepCost(a=0.001, b=0.0, c=0.0, d=0.0, f=0.01)
    engine = Engine(EngineConfig(num_blocks=40, block_size=BS), [7], cost)
    for name in "abc":
        engine.add_request(name, [ord(name)] * 10, _params(2))
    first = engine.step()
    assert first is not None and first.admitted == 3
    assert first.duration == pytest.approx(0.001 + 3 * 0.01)
    second = engine.step()  # decoding only: nothing taken in
    assert second is not None and second.admitted == 0
    assert second.duration == pytest.approx(0.001)


def test_an_aborted_request_frees_its_blocks() -> None:
    engine = _engine()
    engine.add_request("a", [1] * 9, _params(50))
    engine.step()
    assert engine.abort("a")
    assert engine.pool.num_free == engine.pool.num_usable and not engine.has_work


def test_a_prefill_late_in_a_long_context_costs_more_than_the_same_tokens_at_its_start() -> None:
    def engine() -> Engine:
        cfg = EngineConfig(num_blocks=3000, block_size=16, profile="h100x8-glm46-fp8")
        return Engine(cfg, [7])

    warm = engine()
    context = list(range(1, 20_001))
    warm.add_request("first", context, _params(1))
    warm.run_until_idle()
    # 20,000 tokens (1,250 full blocks) are cached; the next call prefills 1,024 new ones.
    warm.add_request("next", [*context, *range(30_001, 31_025)], _params(1))
    late = warm.step()
    cold = engine()
    cold.add_request("fresh", list(range(40_001, 41_025)), _params(1))
    early = cold.step()
    assert late is not None and early is not None
    assert late.prefill_tokens == early.prefill_tokens == 1024
    assert late.prefill_positions == 1024 * 20_000 + 1024 * 1025 // 2
    assert late.duration - early.duration == pytest.approx(warm.cost.e * 1024 * 20_000, rel=1e-9)


def test_chunked_prefill_pays_the_whole_prompt_s_attention_once() -> None:
    cfg = EngineConfig(num_blocks=2000, block_size=16, max_num_batched_tokens=2048)
    engine = Engine(cfg, [7])
    engine.add_request("a", list(range(1, 10_001)), _params(1))
    total = 0
    while engine.has_work:
        result = engine.step()
        assert result is not None
        total += result.prefill_positions
    assert total == 10_000 * 10_001 // 2
