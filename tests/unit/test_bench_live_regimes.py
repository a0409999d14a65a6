"""live-peers in the published regimes (benchmarks/peers.py): each regime is its published
scenario scaled down with capacity per program kept, and the peers are told the regime (the
vLLM router's cost models calibrated, every scheduling timer divided by the time scale)."""

from __future__ import annotations

import asyncio
import json

import pytest

from thunder_mw.benchmarks import bench_cli, peers
from thunder_mw.benchmarks.replay import ClosedLoopQueue, run_until
from thunder_mw.benchmarks.scenarios import PUBLISHED_SCENARIOS
from thunder_mw.benchmarks.workloads import generate
from thunder_mw.sim.cost_model import get_profile


def test_the_cli_offers_every_regime() -> None:
    assert bench_cli.LIVE_PEERS_REGIMES == tuple(peers.LIVE_REGIMES)


@pytest.mark.parametrize("name", ["live-peers-glm46", "live-peers-minimax"])
def test_a_regime_keeps_its_published_capacity_per_program(name: str) -> None:
    regime = peers.LIVE_REGIMES[name]
    assert regime.published is not None
    published = PUBLISHED_SCENARIOS[regime.published]
    scenario = regime.scenario
    kv = peers.scenario_cluster(scenario, 0).kv_tokens
    capacity = get_profile(published.profile).capacity_tokens
    assert capacity
    assert (scenario.profile, scenario.workload, scenario.engines) == (
        published.profile,
        published.workload,
        published.engines,
    )
    per_program = capacity / published.programs_per_engine
    assert kv / scenario.programs_per_engine == pytest.approx(per_program, abs=1)
    assert scenario.max_model_len <= kv  # an engine must hold one whole context
    assert scenario.stop_at_window_end


def test_the_vllm_router_is_calibrated_in_the_engines_wall_seconds() -> None:
    regime = peers.LIVE_REGIMES["live-peers-glm46"]
    tuning = regime.tuning(40.0)
    assert tuning is not None
    config = peers.vllm_router_program_config(77_687, tuning)
    assert config["global_queue"] is True
    assert config["token_capacity_per_dp_rank"] == 77_687
    assert config["max_acting_ttl_seconds"] == 10.0 / 40
    cost = get_profile("h100x8-glm46-fp8")
    # Its 1 s poll would be 25 ms: held at the floor that keeps the engines on time.
    assert config["metrics_interval_seconds"] == peers.MIN_POLL_S
    assert peers.vllm_router_program_config(1, peers.PeerTuning(5.0, cost, 8192))[
        "metrics_interval_seconds"
    ] == pytest.approx(0.2)
    decode = config["decode_throughput_model"]
    assert decode["fixed_step_seconds"] == pytest.approx(cost.a / 40)
    assert decode["context_step_seconds_per_token"] == pytest.approx(cost.d / 40)
    # The same profile at time scale 1 is the real-engine calibration (vllm_real's).
    real = peers.router_cost_models(cost, tuning.chunk_tokens)
    assert real["prefill_cost_model"]["intercept_seconds"] == pytest.approx(
        40 * config["prefill_cost_model"]["intercept_seconds"]
    )
    assert (
        real["prefill_cost_model"]["decode_throughput_alpha"]
        == config["prefill_cost_model"]["decode_throughput_alpha"]
    )


def test_untuned_peers_get_only_the_kv_capacity() -> None:
    assert peers.LIVE_REGIMES["live-peers"].tuning(20.0) is None
    argv = peers.peer_argv(peers.SYSTEMS["vllm-router/program"], ["http://e"], 1, 2, 32_768)
    config = json.loads(argv[argv.index("--program-scheduling-config-json") + 1])
    assert config == {"token_capacity_per_dp_rank": 32_768}
    smg = peers.peer_argv(peers.SYSTEMS["smg/cache_aware"], ["http://e"], 1, 2, 32_768)
    assert "--cache-ttl-secs" not in smg


def test_smg_timers_are_whole_seconds_of_at_least_one() -> None:
    flags = peers.smg_timer_flags(40.0)
    values = dict(zip(flags[::2], flags[1::2], strict=True))
    assert values == {
        "--worker-warmup-secs": "2",  # 60 / 40 = 1.5
        "--cache-ttl-secs": "5",  # 180 / 40 = 4.5
        "--eviction-interval-secs": "2",
        "--load-monitor-interval": "1",  # 10 / 40 = 0.25: smg takes no less than 1
        "--max-idle-secs": "360",
    }


def test_a_closed_loop_stops_when_its_last_program_starts() -> None:
    programs = generate("swe-agent", 5, seed=0)
    started: list[str] = []
    ended: list[str] = []

    async def loop(queue: ClosedLoopQueue) -> None:
        while (spec := queue.next()) is not None:
            started.append(spec.program_id)
            await asyncio.sleep(0.01 * len(started))
            ended.append(spec.program_id)

    async def main() -> None:
        queue = ClosedLoopQueue(programs)
        await run_until(asyncio.gather(loop(queue), loop(queue)), queue.emptied)

    asyncio.run(main())
    assert started == [p.program_id for p in programs]
    # The last start ends the run: the programs still running then never end.
    assert len(ended) < len(started)
    assert started[-1] not in ended


def test_a_closed_loop_that_ends_first_is_awaited_whole() -> None:
    async def main() -> tuple[None, None]:
        runs = asyncio.gather(asyncio.sleep(0), asyncio.sleep(0))
        await run_until(runs, asyncio.Event())
        return runs.result()

    assert list(asyncio.run(main())) == [None, None]


def test_thunder_mw_is_paired_with_each_system_round_by_round() -> None:
    def run(system: str, rnd: int, steps: float) -> dict[str, object]:
        return {"system": system, "round": rnd, "steps_per_min_steady": steps}

    runs = [run("thunder-mw", r, 30.0 + r) for r in range(3)]
    runs += [run("a", r, 20.0 + r) for r in range(3)]  # below in every round: a win
    runs += [run("b", r, v) for r, v in enumerate((28.0, 33.0, 31.0))]  # either side: a tie
    runs += [run("c", 0, 10.0)]  # one round only: no interval
    out = peers.paired(["thunder-mw", "a", "b", "c"], runs)
    assert out["thunder-mw/a"]["verdict"] == "win"
    assert out["thunder-mw/a"]["ratio"] == round(93 / 63, 3)
    assert out["thunder-mw/b"]["verdict"] == "tie"
    assert out["thunder-mw/c"] is None
