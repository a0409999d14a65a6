"""Specification of the discrete-event benchmark harness and `thunder-mw bench` (tiny runs)."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.bench_schema import RECORD_KEYS

from thunder_mw.benchmarks.bench_cli import add_bench_arguments, engine_counters, run_bench
from thunder_mw.benchmarks.des import Arrivals, ClusterConfig, Simulation, simulate
from thunder_mw.benchmarks.scenarios import POLICIES, SCENARIOS
from thunder_mw.benchmarks.workloads import PRESETS, LogNormal, ProgramSpec, generate
from thunder_mw.policies import BackendChanged, Event, Outcome
from thunder_mw.policies.core import Resumed
from thunder_mw.policies.events import BackendMetrics
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.stages import Admission

# swe-agent's shape with short answers, so a run past the knee takes a fraction of a second.
TINY_SWE = dataclasses.replace(
    PRESETS["swe-agent"],
    name="tiny-swe",
    output_tokens=LogNormal(40, 0.5, 8, 200),
    tool_result_tokens=LogNormal(250, 0.8, 10, 1500),
    start_s=None,
)

SMALL = ClusterConfig(engines=2, kv_tokens=12_288, max_model_len=8192)


def bench(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    return run_bench(parser.parse_args(list(argv)))


def swe(n: int = 12) -> list[ProgramSpec]:
    return generate(TINY_SWE, n, seed=1, max_context_tokens=8192)


def test_bench_writes_one_record_per_policy_with_every_metric(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    # One wave (a steady scenario stops at its window's end, before every program is done).
    code = bench(
        "--scenario", "live-small", "--engines", "2", "--programs-per-engine", "3",
        "--programs", "8", "--no-sweep", "--no-plots", "--jobs", "1", "--output", str(out),
    )  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    assert {"scenario", "mode", "seed", "config", "results"} <= report.keys()
    assert report["scenario"] == "live-small" and report["mode"] == "des"
    assert [r["policy"] for r in report["results"]] == list(SCENARIOS["live-small"].policies)
    for record in report["results"]:
        assert RECORD_KEYS <= record.keys()
        assert record["programs_completed"] == 8 and record["programs_failed"] == 0
        assert 0.0 <= record["prefix_hit_rate"] <= 1.0
        assert record["steps_per_min"] > 0


SMALL_RUN = (
    "--scenario", "chat-control", "--engines", "2", "--programs-per-engine", "3",
    "--programs", "8", "--no-sweep", "--no-plots", "--jobs", "1",
)  # fmt: skip


def test_a_seed_other_than_zero_reports_its_own_series(tmp_path: Path) -> None:
    # `--seed N` once crashed: the series were kept for seed 0 only.
    out = tmp_path / "r.json"
    code = bench(
        "--scenario", "chat-control", "--engines", "2", "--programs-per-engine", "3",
        "--programs", "8", "--no-sweep", "--no-plots", "--jobs", "1", "--seed", "3",
        "--policies", "sticky", "--output", str(out),
    )  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    assert report["seed"] == 3 and report["timeseries"]["sticky"]


def test_two_workers_give_the_rows_one_gives(tmp_path: Path) -> None:
    # With --jobs 2 each run is made in a worker process; the file must not show it: the
    # same rows, figure for figure, in the same order.
    files = []
    for jobs in ("1", "2"):
        out = tmp_path / f"r{jobs}.json"
        argv = [*SMALL_RUN, "--policies", "sticky,thunder-mw", "--output", str(out)]
        argv[argv.index("--jobs") + 1] = jobs
        assert bench(*argv) == 0
        files.append(json.loads(out.read_text()))
    rows = [[{k: v for k, v in r.items() if k != "wall_s"} for r in f["sweep"]] for f in files]
    assert [(r["policy"], r["wave"]) for r in rows[1]] == [
        (r["policy"], r["wave"]) for r in rows[0]
    ]
    assert rows[1] == rows[0]
    assert any(r["wave"] for r in rows[0]) and any(not r["wave"] for r in rows[0])


def test_results_go_under_the_current_directory_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # installed, the package's own folder is site-packages
    assert bench(*SMALL_RUN) == 0
    assert (tmp_path / "results" / "chat-control.json").is_file()


def test_results_dir_moves_the_default_result_file(tmp_path: Path) -> None:
    assert bench(*SMALL_RUN, "--results-dir", str(tmp_path / "out")) == 0
    assert (tmp_path / "out" / "chat-control.json").is_file()


def test_live_mode_refuses_a_multi_wave_scenario_without_a_program_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench("--scenario", "chat-control", "--mode", "live") == 2
    assert "--programs" in capsys.readouterr().err


def test_an_unknown_policy_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench("--scenario", "chat-control", "--policies", "nope", "--no-plots") == 2


def test_a_policy_named_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # It once ran twice and wrote each row twice (a variants file's policies plus the one
    # being rerun, already among them).
    assert bench("--scenario", "chat-control", "--policies", "sticky,sticky", "--no-plots") == 2
    assert "more than once" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["round_robin", "sticky", "thunderagent", "thunder-mw"])
def test_every_program_completes_past_the_knee(policy: str) -> None:
    result = simulate(swe(), POLICIES[policy], SMALL, Arrivals("closed", 8), policy)
    m = result.metrics
    assert m["programs_completed"] == 12 and m["programs_failed"] == 0
    assert 0.0 <= m["prefix_hit_rate"] <= m["prefix_hit_rate_ideal"] <= 1.0
    assert m["steps"] == sum(len(p.calls) for p in swe())
    assert m["jct_p99_s"] >= m["jct_mean_s"] > 0


def test_program_aware_scheduling_holds_requests_and_resumes_them_all() -> None:
    result = simulate(swe(), POLICIES["thunder-mw"], SMALL, Arrivals("batch"), "thunder-mw")
    assert result.metrics["held_requests"] > 0 and result.metrics["paused_time_s"] > 0
    assert result.metrics["programs_completed"] == 12
    # Time held counts in TTFT: it is measured from when the client sent the call.
    assert result.metrics["ttft_max_s"] > 1.0


def test_round_robin_sends_each_call_of_a_program_to_the_next_engine() -> None:
    forwards: list[tuple[str, str]] = []
    sim = Simulation(swe(2), POLICIES["round_robin"], SMALL, Arrivals("closed", 1))

    def spying(label: str, add: Callable[..., Any]) -> Callable[..., Any]:
        def spy(request_id: str, *rest: Any, **kw: Any) -> Any:
            forwards.append((request_id.split("#")[0], label))  # "<program>#<call>"
            return add(request_id, *rest, **kw)

        return spy

    for label, backend in sim.backends.items():  # a spy on each engine of this simulation
        backend.engine.add_request = spying(label, backend.engine.add_request)  # type: ignore[method-assign]
    sim.run()
    first = [label for pid, label in forwards if pid == "p0"]
    assert len(set(first)) == 2
    assert all(a != b for a, b in itertools.pairwise(first))


def test_a_held_program_runs_only_after_a_resumed_action_names_it() -> None:
    resumed: set[str] = set()
    sim = Simulation(
        swe(),
        POLICIES["thunder-mw"],
        SMALL,
        Arrivals("batch"),
        on_action=lambda a: resumed.add(a.program_id) if isinstance(a, Resumed) else None,
    )
    sim.run()
    assert resumed == {p.program_id for p in swe()}


def test_recomputed_prefill_is_larger_without_affinity() -> None:
    rr = simulate(swe(), POLICIES["round_robin"], SMALL, Arrivals("closed", 4)).metrics
    sticky = simulate(swe(), POLICIES["sticky"], SMALL, Arrivals("closed", 4)).metrics
    assert rr["recomputed_prefill_tokens"] > sticky["recomputed_prefill_tokens"]
    assert rr["prefix_hit_rate"] < sticky["prefix_hit_rate"]


def test_the_same_seed_gives_the_same_metrics() -> None:
    a = simulate(swe(), POLICIES["thunder-mw"], SMALL, Arrivals("closed", 6)).metrics
    b = simulate(swe(), POLICIES["thunder-mw"], SMALL, Arrivals("closed", 6)).metrics
    assert a == b


def test_kv_usage_time_series_has_one_line_per_engine() -> None:
    result = simulate(swe(4), POLICIES["sticky"], SMALL, Arrivals("batch"))
    series = result.timeseries
    assert set(series["kv_usage"]) == {"e0", "e1"}
    assert all(len(v) == len(series["t_s"]) for v in series["kv_usage"].values())
    assert all(0.0 <= u <= 1.0 for v in series["kv_usage"].values() for u in v)


def test_a_per_call_overhead_lengthens_each_call_of_a_program_by_it() -> None:
    # One program alone: its makespan grows by exactly the overhead per call (the answer
    # reaches the client that much later; the engine's steps are unchanged).
    from thunder_mw.benchmarks.workloads import Call, ProgramSpec

    program = ProgramSpec("p", "t", system_tokens=64, calls=(Call(32, 8, 0.5), Call(16, 8, 0.0)))
    base = ClusterConfig(engines=1, kv_tokens=4096, profile="cpu-tiny")
    plain = simulate([program], POLICIES["vllm"], base)
    slower = simulate([program], POLICIES["vllm"], dataclasses.replace(base, call_overhead_s=0.25))
    assert slower.jct_s[0] == pytest.approx(plain.jct_s[0] + 2 * 0.25, abs=1e-3)
    assert slower.metrics["prefix_hit_rate"] == plain.metrics["prefix_hit_rate"]


def test_the_admission_controller_runs_in_the_des_and_sets_both_limits() -> None:
    # A closed loop past the knee, long enough for probe rounds: each engine gets its own
    # controller; admission holds to capacity x its factor, pausing starts at or above it.
    # (The default runs it only on an engine with a host tier; the earlier default on every.)
    sim = Simulation(
        swe(120),
        POLICIES["thunder-mw/recompute-overflow"],
        SMALL,
        Arrivals("closed", 16),
        "thunder-mw",
    )
    sim.run()
    admission = next(s for s in sim.core.stages if s.name == "admission")
    points = admission.points  # type: ignore[attr-defined]
    assert set(points) == set(sim.core.backends)
    for label, point in points.items():
        backend = sim.core.backends[label]
        assert backend.capacity is not None
        assert point.rounds >= 1
        factor = admission.admit_limit[label] / backend.capacity  # type: ignore[attr-defined]
        assert 0.9 <= factor <= 8.0
        assert backend.capacity + backend.overflow_tokens >= admission.admit_limit[label]  # type: ignore[attr-defined]


def test_the_fixed_rules_ablation_runs_no_controller() -> None:
    sim = Simulation(swe(12), POLICIES["thunder-mw/fixed"], SMALL, Arrivals("batch"), "fixed")
    sim.run()
    admission = next(s for s in sim.core.stages if s.name == "admission")
    assert admission.points == {}  # type: ignore[attr-defined]


@pytest.mark.parametrize("tier", [0, 24_576])
def test_by_default_only_a_tiered_engine_runs_the_controller(tier: int) -> None:
    # `recompute_overflow` off (the default): an engine without a host tier holds at its
    # watermark (no controller, nothing allowed past it to recompute); one with a tier runs
    # the controller.
    cluster = dataclasses.replace(SMALL, engine_options=(("host_kv_tokens", tier),))
    sim = Simulation(swe(120), POLICIES["thunder-mw"], cluster, Arrivals("closed", 16), "t")
    sim.run()
    admission = next(s for s in sim.core.stages if s.name == "admission")
    points = admission.points  # type: ignore[attr-defined]
    if tier:
        assert set(points) == set(sim.core.backends)
    else:
        assert points == {} and admission.admit_limit == {}  # type: ignore[attr-defined]
        assert all(b.overflow_tokens == 0 for b in sim.core.backends.values())


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_benchmark_policy_is_a_pipeline_that_builds(policy: str) -> None:
    # A variant naming a param the stages no longer have fails here, not hours into a run.
    assert build_pipeline(POLICIES[policy])


def test_thunder_mw_prices_from_the_engine_counters_and_the_baselines_read_none() -> None:
    # As live: thunder-mw's pipelines learn from the counters unless a variant says not
    # (`call-timings`); a baseline prices nothing, so its runs need none (and its files'
    # runs stay reusable); the scenario's switch gives them to every policy.
    scenario = SCENARIOS["swe-agent-knee"]
    assert engine_counters(scenario, "thunder-mw")
    assert engine_counters(scenario, "thunder-mw/host-tier")
    assert engine_counters(scenario, "thunder-mw/fixed")
    assert not engine_counters(scenario, "thunder-mw/call-timings")
    assert not engine_counters(scenario, "vllm_router_program")
    assert not engine_counters(scenario, "offload")
    every = dataclasses.replace(scenario, engine_counters=True)
    assert engine_counters(every, "offload") and engine_counters(every, "thunder-mw/call-timings")


@pytest.mark.parametrize("counters", [False, True])
def test_scrapes_carry_the_engine_cost_counters_when_asked_as_live_ones_do(
    counters: bool,
) -> None:
    # engines/pool.py reads vLLM's prefill and decode sums; ClusterConfig.engine_counters
    # has the simulator's scrapes carry the same four.
    cluster = dataclasses.replace(SMALL, engine_counters=counters)
    sim = Simulation(swe(6), POLICIES["thunder-mw"], cluster, Arrivals("batch"), "thunder-mw")
    label, last = _scrapes_of(sim)[-1]
    stats = sim.backends[label].engine.stats
    fields = (
        last.prefill_seconds_total,
        last.prefill_tokens_total,
        last.decode_seconds_total,
        last.decode_tokens_total,
        last.steps_total,
        last.inter_token_seconds_total,
        last.inter_tokens_total,
    )
    if not counters:
        assert fields == (None,) * 7
        return
    assert last.steps_total is not None and 0 < last.steps_total <= stats.steps
    assert last.inter_tokens_total is not None and last.inter_token_seconds_total is not None
    assert 0 < last.inter_tokens_total < stats.generation_tokens  # first tokens not counted
    assert 0 < last.inter_token_seconds_total <= last.inter_tokens_total * stats.busy_seconds
    assert stats.request_prefill_kv_computed_tokens > 0  # something was timed
    assert last.prefill_tokens_total is not None and last.decode_tokens_total is not None
    assert 0 < last.prefill_tokens_total <= stats.request_prefill_kv_computed_tokens
    assert 0 < last.decode_tokens_total <= stats.generation_tokens
    admission = next(s for s in sim.core.stages if isinstance(s, Admission))
    assert admission.costs[label].from_engine  # the price came from them


def test_a_scrape_reads_the_waiting_queue_or_the_gauge_vllm_reports() -> None:
    # A burst at t=0 the engine takes in at its first step: the queue shows it to the first
    # scrape, vLLM's gauge (made after a step's schedule) never does (sim/engine.py).
    waiting: dict[str, list[int | None]] = {}
    for kind in ("queue", "gauge"):
        cluster = dataclasses.replace(SMALL, engines=1, waiting=kind)
        sim = Simulation(swe(3), POLICIES["vllm"], cluster, Arrivals("batch"), "vllm")
        waiting[kind] = [metrics.waiting for _, metrics in _scrapes_of(sim)]
    assert waiting["queue"][0] == 3 and waiting["gauge"][0] == 0
    assert len(waiting["queue"]) == len(waiting["gauge"]) > 1


def _scrapes_of(sim: Simulation) -> list[tuple[str, BackendMetrics]]:
    """Runs `sim`; the (engine, metrics) of every scrape the core was handed, in order."""
    seen: list[tuple[str, BackendMetrics]] = []
    handle = sim.core.handle

    def scraped(event: Event) -> Outcome:
        if isinstance(event, BackendChanged) and event.metrics is not None:
            seen.append((event.label, event.metrics))
        return handle(event)

    sim.core.handle = scraped  # type: ignore[method-assign]
    sim.run()
    return seen
