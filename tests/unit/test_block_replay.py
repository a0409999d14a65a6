"""lab/block_replay.py: a recorded engine's block calls replay to the same results and state,
and a replay that differs is reported."""

from __future__ import annotations

import pickle
from pathlib import Path

from thunder_mw.lab.block_replay import final_digest, recording, replay, replay_log
from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams


def _tiered_workload() -> Engine:
    """Programs whose contexts outgrow a small GPU pool: evictions, host stores and loads."""
    cfg = EngineConfig(
        num_blocks=24,
        block_size=4,
        max_num_seqs=4,
        profile="instant",
        host_kv_tokens=48,
        host_load_tokens_per_s=1000.0,
    )
    engine = Engine(cfg, [7, 8, 9])
    prompts = {p: [100 * (p + 1) + i for i in range(10)] for p in range(3)}
    for turn in range(4):
        for p, prompt in prompts.items():
            prompt += [p, turn, 1, 2, 3]
            engine.add_request(
                f"{p}-{turn}",
                list(prompt),
                SamplingParams(max_tokens=6, ignore_eos=True),
                program_id=str(p),
            )
        engine.run_until_idle()
    return engine


def test_a_recorded_run_replays_to_the_same_results_and_state(tmp_path: Path) -> None:
    with recording() as log:
        engine = _tiered_workload()
    assert engine.host_tier is not None and engine.host_tier.loaded_blocks > 0
    kinds = {entry[0] for entry in log}
    assert {"allocate", "cache_range", "free_request", "load_prefix"} <= kinds
    live = final_digest([engine.host_tier, engine.pool])  # built in that order
    _, differ, digest = replay_log(log, check=True)
    assert (differ, digest) == (0, live)

    path = tmp_path / "calls.pkl"
    path.write_bytes(pickle.dumps(log))
    assert replay(path, check=True)[1:] == (0, live)


def test_a_call_whose_result_differs_is_counted() -> None:
    with recording() as log:
        _tiered_workload()
    at = next(i for i, entry in enumerate(log) if entry[0] == "allocate")
    kind, oid, args, result, state = log[at]
    log[at] = (kind, oid, args, [*result, -1], state)
    assert replay_log(log, check=True)[1] == 1
