"""Specification of Continuum's TTL pinning in the simulator: a finished request's KV stays
pinned for its TTL, or until its program's next request arrives."""

from __future__ import annotations

from thunder_mw.sim.cost_model import StepCost
from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams, Sequence

BS = 4
COST = StepCost(a=1e-3, b=0.0, c=0.0, d=0.0)  # every step takes 1 ms
A = list(range(100, 120))
B = list(range(200, 220))


def _engine(num_blocks: int = 7) -> Engine:
    return Engine(EngineConfig(num_blocks=num_blocks, block_size=BS, profile="instant"), [7], COST)


def _run(
    engine: Engine,
    rid: str,
    prompt: list[int],
    ttl: float | None = None,
    program: str | None = None,
) -> Sequence:
    params = SamplingParams(max_tokens=1, ignore_eos=True, kv_ttl_s=ttl)
    seq = engine.add_request(rid, prompt, params, program_id=program)
    engine.run_until_idle()
    return seq


def test_a_finished_request_with_a_ttl_keeps_its_full_blocks_pinned() -> None:
    engine = _engine()
    _run(engine, "a0", A, ttl=5.0, program="a")
    pin = engine.pin_of("a")
    assert pin is not None and pin[0] == 5  # 20 prompt + 1 output token: 5 full blocks
    assert engine.pool.num_free == engine.pool.num_usable - 5
    assert engine.pinned_blocks == 5


def test_pinned_blocks_are_not_evicted_by_other_requests() -> None:
    engine = _engine(num_blocks=12)  # 11 usable: B fits beside the 5 pinned blocks
    _run(engine, "a0", A, ttl=5.0, program="a")
    _run(engine, "b0", B)
    again = _run(engine, "a1", [*A, 1, 2, 3], program="a")
    assert again.num_cached_tokens == 20


def test_without_a_pin_the_same_pressure_evicts_the_context() -> None:
    engine = _engine(num_blocks=12)
    _run(engine, "a0", A)
    _run(engine, "b0", B)
    _run(engine, "c0", list(range(300, 320)))
    again = _run(engine, "a1", [*A, 1, 2, 3])
    assert again.num_cached_tokens < 20


def test_the_pin_ends_when_its_ttl_runs_out() -> None:
    engine = _engine()
    _run(engine, "a0", A, ttl=0.5, program="a")
    engine.advance(engine.now + 0.49)
    assert engine.pin_of("a") is not None
    engine.advance(engine.now + 0.02)
    assert engine.pin_of("a") is None
    assert engine.stats.pins_expired == 1
    assert engine.pool.num_free == engine.pool.num_usable


def test_the_programs_next_request_ends_the_pin() -> None:
    engine = _engine()
    _run(engine, "a0", A, ttl=60.0, program="a")
    engine.add_request("a1", [*A, 1], SamplingParams(max_tokens=1, ignore_eos=True), program_id="a")
    assert engine.pin_of("a") is None
    assert engine.stats.pins_released == 1


def test_a_request_covering_the_pinned_context_ends_a_pin_left_without_a_program_id() -> None:
    engine = _engine(num_blocks=12)
    _run(engine, "a0", A, ttl=60.0)
    assert engine.pin_of("a0") is not None
    again = _run(engine, "a1", [*A, 1, 2, 3, 4, 5])
    assert again.num_cached_tokens == 20
    assert engine.pin_of("a0") is None and engine.stats.pins_released == 1


def test_a_request_that_cannot_fit_beside_pins_waits_for_the_next_expiry() -> None:
    engine = _engine(num_blocks=7)  # 6 usable; 5 pinned leave 1 block, B needs 6
    _run(engine, "a0", A, ttl=2.0, program="a")
    start = engine.now
    seq = _run(engine, "b0", B)
    assert seq.finish_reason == "length"
    assert engine.now - start >= 2.0  # it waited for the pin to run out
    assert engine.stats.pins_expired == 1


def test_a_new_pin_of_the_same_program_replaces_the_old_one() -> None:
    engine = _engine(num_blocks=20)
    _run(engine, "a0", A, ttl=60.0, program="a")
    engine.add_request("b", B, SamplingParams(max_tokens=1, ignore_eos=True, kv_ttl_s=60.0))
    engine.run_until_idle()
    _run(engine, "a1", [*A, 1, 2, 3, 4, 5], ttl=60.0, program="a")
    pin = engine.pin_of("a")
    assert pin is not None and pin[0] == 6  # 25 prompt + 1 output: 6 full blocks
    assert engine.pin_of("b") is not None
