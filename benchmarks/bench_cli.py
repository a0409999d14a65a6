"""`thunder-mw bench`: run a named scenario for every policy, write the result JSON and plots.

    thunder-mw bench --scenario swe-agent-knee [--mode des|live] [--policies a,b]
                     [--output PATH] [--results-dir DIR] [--seed N]
    thunder-mw bench --scenario vllm-cpu-real [--regimes cheap,dear] [--repeats N] [--resimulate]
    thunder-mw bench --scenario idle-gaps [--output PATH]   (python -m ...idle_gaps for options)
    thunder-mw bench --scenario mini-swe-agent [--programs 32] [--seeds 3]   (needs Docker)
    thunder-mw bench --scenario fuzz [--seed N] [--output PATH]   (python -m ...fuzz for options)

A scenario on the real vLLM CPU engine (vllm-cpu-real) ignores --mode: it is always real.

Runs are independent, so they go to a pool of worker processes (`--jobs`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from thunder_mw.benchmarks.des import Arrivals, ClusterConfig, Simulation, simulate
from thunder_mw.benchmarks.figures import capped_rows, choose_caps, figures, format_figures
from thunder_mw.benchmarks.reproduction import (
    format_reproduction,
    host_tier_options,
    host_tier_tokens,
    summarise_runs,
)
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.reuse import ReuseError, check_config, pause_rule, reused_output
from thunder_mw.benchmarks.scenarios import (
    CAPPED,
    POLICIES,
    POLICY_ENGINE_OPTIONS,
    SCENARIOS,
    Scenario,
    engine_kv_tokens,
    kv_tokens_of,
)
from thunder_mw.benchmarks.workloads import (
    MIX_PREFIX,
    ProgramSpec,
    generate,
    generate_mix,
    load_trace,
)
from thunder_mw.benchmarks.workloads import PRESETS as WORKLOADS
from thunder_mw.schemas.stage_params import AdmissionParams, MigrationParams, PauseParams

__all__ = [
    "FUZZ",
    "IDLE_GAPS",
    "LIVE_PEERS",
    "LIVE_PEERS_REGIMES",
    "LIVE_TIME_SCALE",
    "MINI_SWE_AGENT",
    "PROXY_OVERHEAD",
    "ROLLOUT",
    "TABLE_COLUMNS",
    "Job",
    "Taken",
    "add_bench_arguments",
    "cap_values",
    "cluster_for",
    "engine_counters",
    "engine_options",
    "format_table",
    "job_inputs",
    "lower_caps",
    "main_jobs",
    "plan_jobs",
    "resolved_rules",
    "run_bench",
    "run_job",
    "run_live_scenario",
    "run_scenario",
    "scenario_config",
    "shared_policies",
    "write_plots",
]

PROXY_OVERHEAD = "proxy-overhead"
IDLE_GAPS = "idle-gaps"
ROLLOUT = "rollout"  # benchmarks/rollout.py: RL rollout waves through the live gateway
LIVE_PEERS = "live-peers"  # benchmarks/peers.py: the real peer routers live, or their stand-ins
# ... and in scaled-down published regimes (peers.LIVE_REGIMES, whose names these are).
LIVE_PEERS_REGIMES = (LIVE_PEERS, "live-peers-glm46", "live-peers-minimax")
LIVE_TIME_SCALE = 5.0  # --time-scale of live runs but live-peers' (its regimes have their own)
MINI_SWE_AGENT = "mini-swe-agent"  # benchmarks/mini_swe_agent.py: real agents, Docker sandboxes
FUZZ = "fuzz"  # benchmarks/fuzz.py: bad bodies straight to the engines and through the gateway


class _Without:
    """Lets another module add its options to our parser, minus the ones we already have."""

    def __init__(self, parser: Any, skip: set[str]) -> None:
        self._parser = parser
        self._skip = skip

    def add_argument(self, *names: str, **kwargs: Any) -> Any:
        if self._skip.intersection(names):
            return None
        return self._parser.add_argument(*names, **kwargs)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `thunder-mw bench`."""
    parser.add_argument(
        "--scenario",
        required=True,
        choices=[
            *SCENARIOS,
            PROXY_OVERHEAD,
            IDLE_GAPS,
            ROLLOUT,
            *LIVE_PEERS_REGIMES,
            MINI_SWE_AGENT,
            FUZZ,
        ],
        help="Which scenario to run.",
    )
    parser.add_argument(
        "--mode",
        choices=("des", "live"),
        default="des",
        help="des: discrete-event simulation in-process; live: the real gateway process "
        "in front of simulated engines over HTTP, time-scaled.",
    )
    parser.add_argument(
        "--policies",
        help=f"Comma-separated policies (default: the scenario's). Known: {', '.join(POLICIES)}.",
    )
    parser.add_argument(
        "--output", type=Path, help="Result JSON (default <results-dir>/<scenario>.json)."
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_DIR,
        help=f"Folder of the default result files and plots (default ./{RESULTS_DIR}).",
    )
    parser.add_argument("--seed", type=int, default=0, help="Workload and engine seed.")
    live = parser.add_argument_group("live mode")
    live.add_argument(
        "--time-scale",
        type=float,
        help=f"Simulated seconds per wall second (default {LIVE_TIME_SCALE:g}; live-peers: "
        "20; live-peers-glm46: 30; live-peers-minimax: 40).",
    )
    live.add_argument(
        "--repeats",
        type=int,
        help="Runs per policy or cell (live, proxy-overhead: default 3; vllm-cpu-real: 5).",
    )
    live.add_argument(
        "--live-stream", action="store_true", help="Stream calls (measures TTFT; costs CPU)."
    )
    live.add_argument(
        "--engine-url",
        help="vllm-cpu-real: use this running vLLM engine instead of starting one "
        "(its prefix cache is reset before each run: needs VLLM_SERVER_DEV_MODE=1; "
        "with one --regimes entry, the engine of that regime).",
    )
    live.add_argument(
        "--engine-log",
        type=Path,
        help="vllm-cpu-real with --engine-url: that engine's log, which it writes with "
        "--enable-log-requests; with it the step-cost profile is fitted on the engine before "
        "the runs, under the machine's load of the moment, as when bench starts the engine.",
    )
    live.add_argument(
        "--resimulate",
        action="store_true",
        help="vllm-cpu-real: rerun only the simulator's half on the result file's recorded "
        "runs (their programs, KV blocks and fitted profiles) and rewrite its `simulated` "
        "and `agreement`; the real runs are kept, no engine is started. live-peers*: rerun "
        "the DES stand-ins on the result file's seeds, rewrite `des`, `agreement`, `paired`.",
    )
    live.add_argument(
        "--regimes",
        default="cheap,dear",
        help="vllm-cpu-real: comma-separated regimes (cheap: tiny model, dear: the "
        "dear-recompute model); one engine at a time.",
    )
    des = parser.add_argument_group("simulation (des) overrides")
    des.add_argument("--engines", type=int, help="Engines of the main run.")
    des.add_argument("--programs-per-engine", type=int, help="Concurrent programs per engine.")
    des.add_argument("--programs", type=int, help="Programs in all (default concurrency x 1.5).")
    des.add_argument("--kv-tokens", type=int, help="KV cache capacity per engine, in tokens.")
    des.add_argument("--workload", choices=list(WORKLOADS), help="Workload preset.")
    des.add_argument("--trace", type=Path, help="Replay this JSONL trace instead of a preset.")
    des.add_argument(
        "--seeds", type=int, help="Seeds of the main point (default: the scenario's; --seed first)."
    )
    des.add_argument("--no-sweep", action="store_true", help="Skip the concurrency sweep.")
    des.add_argument(
        "--engine-counters",
        action="store_true",
        help="Every policy's scrapes carry the engine's prefill and decode counters, as live "
        "scrapes do (costs learned from them, not from call timings; recorded per policy).",
    )
    des.add_argument(
        "--rerun",
        help="Comma-separated policies to rerun; every other run is taken from the result "
        "file being replaced (--output), which must have been made with the same scenario "
        "and those policies' pipelines (benchmarks/reuse.py). Empty (--rerun=): rerun none, "
        "run only what the file lacks (a capped policy's lower caps, where its best cap is "
        "the lowest it ran).",
    )
    des.add_argument(
        "--own-main-point",
        action="store_true",
        help="Run the main point of a scenario that shares it with another (cluster-scaling's "
        "is paper-rollout-2node's) rather than take those runs from that scenario's result "
        "file in --results-dir.",
    )
    des.add_argument("--no-plots", action="store_true", help="Do not write PNG plots.")
    des.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="Worker processes.")
    from thunder_mw.benchmarks import proxy_overhead

    group = parser.add_argument_group(f"{PROXY_OVERHEAD} options")
    proxy_overhead.add_arguments(_Without(group, {"--output", "--repeats"}))  # type: ignore[arg-type]


def run_bench(args: argparse.Namespace) -> int:
    """Run the scenario `args` names; the exit status."""
    if args.repeats is None:
        real = args.scenario in SCENARIOS and SCENARIOS[args.scenario].engine == "vllm-cpu"
        args.repeats = 5 if real else 3
    if args.time_scale is None:
        args.time_scale = LIVE_TIME_SCALE
        if args.scenario in LIVE_PEERS_REGIMES:
            from thunder_mw.benchmarks import peers

            args.time_scale = peers.LIVE_REGIMES[args.scenario].time_scale
    harness = _HARNESSES.get(args.scenario)
    if harness is not None:
        return harness(args)
    scenario = _with_overrides(SCENARIOS[args.scenario], args)
    policies = args.policies.split(",") if args.policies else list(scenario.policies)
    if scenario.engine == "vllm-cpu":
        return _run_real(scenario, policies, args)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        print(f"unknown policies {unknown}; known: {sorted(POLICIES)}", file=sys.stderr)
        return 2
    twice = sorted({p for p in policies if policies.count(p) > 1})
    if twice:
        # Each would run (and be written) once per mention: rows no reader can tell apart.
        print(f"--policies names {twice} more than once", file=sys.stderr)
        return 2
    if args.mode == "live":
        return _run_live(scenario, policies, args)
    return _run_des(scenario, policies, args)


def _output_argv(args: argparse.Namespace) -> list[str]:
    return ["--output", str(args.output)] if args.output else []


def _run_idle_gaps(args: argparse.Namespace) -> int:
    from thunder_mw.benchmarks import idle_gaps

    return idle_gaps.main(["--seed", str(args.seed), *_output_argv(args)])


def _run_fuzz(args: argparse.Namespace) -> int:
    from thunder_mw.benchmarks import fuzz

    return fuzz.main(["--seed", str(args.seed), *_output_argv(args)])


def _run_rollout(args: argparse.Namespace) -> int:
    from thunder_mw.benchmarks import rollout

    return rollout.main(["--seed", str(args.seed), *_output_argv(args)])


def _run_proxy_overhead(args: argparse.Namespace) -> int:
    from thunder_mw.benchmarks import proxy_overhead

    if args.output is None:
        args.output = args.results_dir / proxy_overhead.DEFAULT_OUTPUT.name
    proxy_overhead.run(args)
    return 0


def _run_live_peers(args: argparse.Namespace) -> int:
    """The real peer routers live (`--mode live`, or `--resimulate` of such a run: peers.py),
    else their stand-ins in the DES, run here as any scenario's policies are."""
    from thunder_mw.benchmarks import peers

    if args.mode == "live" or getattr(args, "resimulate", False):
        return peers.run_bench(args)
    results = args.results_dir if getattr(args, "results_dir", None) else RESULTS_DIR
    scenario = peers.LIVE_REGIMES[getattr(args, "scenario", LIVE_PEERS)].scenario
    policies = args.policies.split(",") if args.policies else list(scenario.policies)
    absent = [p for p in policies if p not in POLICIES]
    if absent:
        print(f"no DES policy {absent}; known: {sorted(POLICIES)}", file=sys.stderr)
        return 2
    output = args.output or results / f"{scenario.name}-des.json"
    report = run_scenario(scenario, policies, seed=args.seed, sweep=False, jobs=args.jobs)
    write_result(output, report, indent=1)
    print(format_table(report))
    print(f"\nwall {report['wall_s']} s; written to {output}")
    if not args.no_plots:
        for path in write_plots(report, output.with_suffix("")):
            print(f"plot: {path}")
    return 0


def _run_mini_swe_agent(args: argparse.Namespace) -> int:
    from thunder_mw.benchmarks import mini_swe_agent

    # --programs: concurrent runs; its engines run in real time (python -m ... --help).
    argv = ["--seed", str(args.seed)]
    argv += ["--runs", str(args.programs)] if args.programs else []
    argv += ["--seeds", str(args.seeds)] if args.seeds else []
    argv += _output_argv(args)
    return mini_swe_agent.main(argv + (["--no-plots"] if args.no_plots else []))


# The scenarios with a harness of their own (not a Scenario of the DES/live harness).
_HARNESSES: dict[str, Callable[[argparse.Namespace], int]] = {
    IDLE_GAPS: _run_idle_gaps,
    FUZZ: _run_fuzz,
    ROLLOUT: _run_rollout,
    PROXY_OVERHEAD: _run_proxy_overhead,
    **{name: _run_live_peers for name in LIVE_PEERS_REGIMES},
    MINI_SWE_AGENT: _run_mini_swe_agent,
}


def _run_des(scenario: Scenario, policies: list[str], args: argparse.Namespace) -> int:
    output = args.output or args.results_dir / f"{scenario.name}.json"
    reuse, rerun = None, None
    if args.rerun is not None:
        rerun = set(filter(None, args.rerun.split(",")))
        unknown = sorted(rerun - set(policies))
        if unknown:
            print(f"--rerun names policies the run has not: {unknown}", file=sys.stderr)
            return 2
        if not output.is_file():
            print(
                f"--rerun takes the other runs from {output}, which does not exist", file=sys.stderr
            )
            return 2
        reuse = json.loads(output.read_text())
    shared = None
    if scenario.main_point_of and not args.own_main_point:
        source = args.results_dir / f"{scenario.main_point_of}.json"
        if source.is_file():
            shared = json.loads(source.read_text())
        else:
            print(f"{source} does not exist: running the main point here", file=sys.stderr)
    try:
        report = run_scenario(
            scenario,
            policies,
            seed=args.seed,
            trace=args.trace,
            sweep=not args.no_sweep,
            jobs=args.jobs,
            total=args.programs,
            seeds=args.seeds,
            reuse=reuse,
            rerun=rerun,
            shared=shared,
        )
    except ReuseError as e:
        print(f"--rerun: {e} ({output})", file=sys.stderr)
        return 2
    write_result(output, report, indent=1)
    print(format_table(report))
    reproduction = format_reproduction(report)
    if reproduction:
        print(reproduction)
    headline = format_figures(report)
    if headline:
        print(headline)
    print(f"\nwall {report['wall_s']} s; written to {output}")
    if not args.no_plots:
        written = write_plots(report, output.with_suffix(""))
        for path in written:
            print(f"plot: {path}")
    return 0


def _run_live(scenario: Scenario, policies: list[str], args: argparse.Namespace) -> int:
    if scenario.total_factor != 1.0 and not args.programs:
        print("live mode runs one wave of programs: pass --programs", file=sys.stderr)
        return 2
    output = args.output or args.results_dir / f"{scenario.name}-live.json"
    report = run_live_scenario(
        scenario,
        policies,
        seed=args.seed,
        total=args.programs,
        time_scale=args.time_scale,
        repeats=args.repeats,
        stream=args.live_stream,
    )
    write_result(output, report, indent=1)
    print(format_table(report))
    for row in report["live_vs_des"]:
        print(
            f"{row['policy']}: live/des steps/min {row['steps_per_min_ratio']}, "
            f"jct {row['jct_mean_ratio']}"
        )
    print(f"\nwritten to {output}")
    return 0


def _run_real(scenario: Scenario, systems: list[str], args: argparse.Namespace) -> int:
    from thunder_mw.benchmarks import vllm_real

    if args.resimulate:
        return _resimulate_real(args.output or args.results_dir / f"{scenario.name}.json", args)
    regimes = args.regimes.split(",")
    unknown = [r for r in regimes if r not in vllm_real.REGIMES]
    if unknown:
        print(f"unknown regimes {unknown}; known: {list(vllm_real.REGIMES)}", file=sys.stderr)
        return 2
    for name in systems:
        if name != "direct/cap":
            try:
                vllm_real.system_named(name)
            except ValueError as exc:
                print(exc, file=sys.stderr)
                return 2
    if args.engine_url and len(regimes) != 1:
        print("--engine-url serves one regime: pass --regimes with one of them", file=sys.stderr)
        return 2
    if args.engine_log is not None and not args.engine_url:
        print("--engine-log names the log of the engine at --engine-url", file=sys.stderr)
        return 2
    if args.engine_log is not None and not args.engine_log.is_file():
        print(f"--engine-log {args.engine_log}: no such file", file=sys.stderr)
        return 2
    output = args.output or args.results_dir / f"{scenario.name}.json"
    report = vllm_real.run_vllm_real_scenario(
        scenario,
        systems,
        regimes=regimes,
        seed=args.seed,
        repeats=args.repeats,
        programs=args.programs,
        engine_url=args.engine_url,
        engine_log=args.engine_log,
        checkpoint=lambda partial: write_result(output, partial, indent=1),
    )
    print(vllm_real.format_report(report))
    print(f"\nwall {report['wall_s']} s; written to {output}")
    if not args.no_plots:
        for path in vllm_real.write_plots(report, output.with_suffix("")):
            print(f"plot: {path}")
    return 0


def _resimulate_real(path: Path, args: argparse.Namespace) -> int:
    from thunder_mw.benchmarks import vllm_real

    if not path.is_file():
        print(f"--resimulate reads a result file: {path} does not exist", file=sys.stderr)
        return 2
    report = vllm_real.resimulate(json.loads(path.read_text()))
    write_result(path, report, indent=1)
    print(vllm_real.format_report(report))
    print(f"\nsimulated and agreement rewritten in {path}")
    if not args.no_plots:
        for plot in vllm_real.write_plots(report, path.with_suffix("")):
            print(f"plot: {plot}")
    return 0


def run_live_scenario(
    scenario: Scenario,
    policies: list[str],
    *,
    seed: int = 0,
    total: int | None = None,
    time_scale: float = 5.0,
    repeats: int = 3,
    stream: bool = False,
) -> dict[str, Any]:
    """Each policy `repeats` times through the real gateway (median + spread), beside the
    discrete-event run of the same programs and fleet: the two must agree."""
    from thunder_mw.benchmarks.live import run_live

    started = time.perf_counter()
    count = total or max(1, scenario.engines * scenario.programs_per_engine)
    programs = _workload(scenario, count, seed, None)
    cluster = ClusterConfig(
        engines=scenario.engines,
        kv_tokens=kv_tokens_of(scenario),
        max_model_len=scenario.max_model_len,
        profile=scenario.profile,
        seed=seed,
    )
    results: list[dict[str, Any]] = []
    spread: dict[str, dict[str, Any]] = {}
    agreement: list[dict[str, Any]] = []
    for policy in policies:
        runs = [
            run_live(
                programs,
                cluster,
                POLICIES[policy],
                time_scale=time_scale,
                policy=policy,
                stream=stream,
            )
            for _ in range(repeats)
        ]
        runs.sort(key=lambda r: r["steps_per_min"])
        median = runs[len(runs) // 2]
        results.append(median)
        spread[policy] = {}
        for key in ("steps_per_min", "jct_mean_s", "prefix_hit_rate"):
            values = sorted(r[key] for r in runs)
            spread[policy][key] = {
                "min": values[0],
                "median": values[len(values) // 2],
                "max": values[-1],
            }
        des = simulate(programs, POLICIES[policy], cluster, Arrivals("batch"), policy).metrics
        agreement.append(
            {
                "policy": policy,
                "des_steps_per_min": des["steps_per_min"],
                "des_jct_mean_s": des["jct_mean_s"],
                "steps_per_min_ratio": round(median["steps_per_min"] / des["steps_per_min"], 3),
                "jct_mean_ratio": round(median["jct_mean_s"] / des["jct_mean_s"], 3)
                if des["jct_mean_s"]
                else None,
            }
        )
    return {
        "scenario": scenario.name,
        "mode": "live",
        "seed": seed,
        "config": {
            "workload": scenario.workload,
            "engines": scenario.engines,
            "programs": count,
            "kv_tokens_per_engine": kv_tokens_of(scenario),
            "profile": scenario.profile,
            "max_model_len": scenario.max_model_len,
            "time_scale": time_scale,
            "repeats": repeats,
            "stream": stream,
            "policies": {p: POLICIES[p] for p in policies},
        },
        "results": results,
        "spread": spread,
        "live_vs_des": agreement,
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
    }


def _with_overrides(scenario: Scenario, args: argparse.Namespace) -> Scenario:
    changes: dict[str, Any] = {}
    for option, name in (
        ("engines", "engines"),
        ("programs_per_engine", "programs_per_engine"),
        ("kv_tokens", "kv_tokens"),
        ("workload", "workload"),
    ):
        value = getattr(args, option, None)
        if value is not None:
            changes[name] = value
    if getattr(args, "engine_counters", False):
        changes["engine_counters"] = True
    return replace(scenario, **changes) if changes else scenario


# ---------------------------------------------------------------------------------- runs
@dataclass(frozen=True, slots=True)
class Job:
    policy: str
    engines: int
    per_engine: int
    programs: int
    main: bool  # the scenario's main point (full records: JCT samples, time series)
    seed: int = 0
    # The fixed batch (RL batch): concurrency programs, all at t=0, every one run to its end.
    wave: bool = False
    cap: int | None = None  # vllm_capped: the client runs at most this many programs at once


# programs, pipeline, cluster, arrivals, policy: Simulation's arguments, in its order.
SimulationInputs = tuple[
    list[ProgramSpec], list[dict[str, Any]] | None, ClusterConfig, Arrivals, str
]


def _workload(
    scenario: Scenario, programs: int, seed: int, trace: Path | None
) -> list[ProgramSpec]:
    if trace is not None:
        return load_trace(trace)
    if scenario.workload.startswith(MIX_PREFIX):
        return generate_mix(
            scenario.workload, programs, seed=seed, max_context_tokens=scenario.max_model_len
        )
    return generate(
        scenario.workload, programs, seed=seed, max_context_tokens=scenario.max_model_len
    )


def engine_options(scenario: Scenario, policy: str) -> tuple[tuple[str, Any], ...]:
    """EngineConfig fields for `policy`'s engines in `scenario`: the host KV tier (sized to
    the node's host-to-GPU KV ratio, reproduction.host_tier_tokens), Continuum's
    program-level FCFS."""
    own = POLICY_ENGINE_OPTIONS.get(policy, {})
    options: tuple[tuple[str, Any], ...] = ()
    if scenario.host_tier or own.get("host_tier", False):
        # The tier in proportion to the GPU cache where the scenario cuts that below the
        # profile's own (reproduction.host_tier_tokens: one rule for every scenario).
        cut = scenario.kv_tokens is not None or scenario.kv_scale != 1
        gpu = kv_tokens_of(scenario) if cut else None
        tokens = scenario.host_kv_tokens or host_tier_tokens(scenario.profile, gpu)
        options += host_tier_options(int(tokens))
    if own.get("program_fcfs", False):
        options += (("program_fcfs", True),)
    return options


def engine_counters(scenario: Scenario, policy: str) -> bool:
    """Whether `policy`'s scrapes carry the engine's cost counters in `scenario`: its own
    engine option, else yes for thunder-mw's pipelines (they price recompute from them,
    live and here) and no for the baselines (the scenario's turns them on for every
    policy)."""
    own = POLICY_ENGINE_OPTIONS.get(policy, {})
    gateway = policy == "thunder-mw" or policy.startswith("thunder-mw/")
    return scenario.engine_counters or bool(own.get("engine_counters", gateway))


def cluster_for(scenario: Scenario, policy: str, engines: int, seed: int) -> ClusterConfig:
    profiles = scenario.engine_profiles
    if profiles and len(profiles) != engines:
        raise ValueError(f"{scenario.name}: {len(profiles)} engine profiles for {engines} engines")
    return ClusterConfig(
        engines=engines,
        kv_tokens=kv_tokens_of(scenario),
        max_model_len=scenario.max_model_len,
        profile=scenario.profile,
        seed=seed,
        engine_options=engine_options(scenario, policy),
        engine_profiles=profiles,
        engine_kv_tokens=engine_kv_tokens(scenario),
        engine_counters=engine_counters(scenario, policy),
    )


def job_inputs(scenario: Scenario, job: Job, trace: Path | None = None) -> SimulationInputs:
    """What `Simulation` takes for `job`: lab/sim_perf.py builds one from it to read its
    engines' step counts after the run."""
    programs = _workload(scenario, job.programs, job.seed, trace)
    cluster = cluster_for(scenario, job.policy, job.engines, job.seed)
    concurrency = job.cap or job.engines * job.per_engine
    if job.wave:
        # A client-side cap runs the batch as a closed loop of `cap` programs at a time.
        arrivals = Arrivals("closed", job.cap) if job.cap else Arrivals("batch")
    else:
        closed = scenario.arrival == "closed"
        arrivals = Arrivals(
            scenario.arrival,
            concurrency if closed else None,
            stop_at_window_end=closed and scenario.stop_at_window_end,
            burst=min(scenario.burst, concurrency) if closed else 1,
        )
    return programs, POLICIES[job.policy], cluster, arrivals, job.policy


def run_job(
    scenario: Scenario, job: Job, trace: Path | None, base_seed: int = 0
) -> tuple[Job, dict[str, Any]]:
    inputs = job_inputs(scenario, job, trace)
    started = time.perf_counter()
    result = Simulation(*inputs).run()
    out: dict[str, Any] = {
        "metrics": result.metrics,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    # The main report's series and JCTs are those of the first seed asked for (`--seed`).
    if job.main and job.seed == base_seed and not job.wave:
        out["jct_s"] = result.jct_s
        out["timeseries"] = result.timeseries
        out["counters"] = result.counters
    return job, out


def plan_jobs(
    scenario: Scenario,
    policies: list[str],
    seed: int = 0,
    sweep: bool = True,
    total: int | None = None,
    seeds: int | None = None,
) -> list[Job]:
    """Every run a scenario needs: the main point per policy and seed, the sweep points
    (every seed when `sweep_seeds`), the fixed batch per policy and seed when `wave`, and
    the capped policies' cap sweeps (both figures at each cap, every seed)."""
    n_seeds = seeds or scenario.seeds
    capped = [p for p in policies if p in CAPPED]
    policies = [p for p in policies if p not in CAPPED]

    def programs_for(engines: int, per_engine: int, factor: float) -> int:
        return max(1, round(engines * per_engine * factor))

    main_n = total or programs_for(
        scenario.engines, scenario.programs_per_engine, scenario.total_factor
    )
    work = [
        Job(p, scenario.engines, scenario.programs_per_engine, main_n, True, seed + k)
        for k in range(n_seeds)
        for p in policies
    ]
    if sweep:
        sweep_seeds = range(n_seeds) if scenario.sweep_seeds else range(1)
        work += [
            Job(p, engines, per, programs_for(engines, per, scenario.sweep_factor), False, seed + k)
            for engines, per in scenario.sweep
            for k in sweep_seeds
            for p in policies
        ]
    wave_n = scenario.engines * scenario.programs_per_engine
    if scenario.wave:
        work += [
            Job(p, scenario.engines, scenario.programs_per_engine, wave_n, True, seed + k, True)
            for k in range(n_seeds)
            for p in policies
        ]
    for name in capped:
        for cap in cap_values(scenario):
            for k in range(n_seeds):
                point = (scenario.engines, scenario.programs_per_engine)
                work.append(Job(name, *point, main_n, True, seed + k, cap=cap))
                if scenario.wave:
                    work.append(Job(name, *point, wave_n, True, seed + k, True, cap))
    # Largest first, so the pool's last straggler is a small run.
    work.sort(key=lambda j: -j.programs * j.engines)
    return work


def main_jobs(spec: str) -> tuple[Scenario, list[Job], int]:
    """`SCENARIO:POLICY[:SEED]` (seed 0 if left out): the scenario, POLICY's main runs as
    `thunder-mw bench` plans them (no sweep point, no wave; one per cap of a capped policy)
    and the seed; for the tools that rerun one run (lab/des_digest.py, lab/sim_perf.py)."""
    name, policy, *rest = spec.split(":")
    seed = int(rest[0]) if rest else 0
    scenario = SCENARIOS[name]
    jobs = plan_jobs(scenario, [policy], seed=seed, sweep=False, seeds=1)
    return scenario, [j for j in jobs if j.main and not j.wave], seed


def resolved_rules(scenario: Scenario, policies: list[str]) -> dict[str, dict[str, str]]:
    """Per policy, the rules its pipeline resolves to where the result file would otherwise
    not name them (`admission: {}` is the default's, and defaults change):
    `admission_overflow`, the admission stage's overflow rule; `pause_victim`, the
    state-aware-pause stage's victim (it changed after 0.2.0: a file that does not say ran
    `cost_benefit`, reuse.py); `queue_order`, the migration stage's order of held programs
    on this scenario's engines (`started_first` or `arrival`; `started_first: null` picks by
    whether the engines have a host KV tier, and a file that does not say ran `arrival`
    unless its pipeline said otherwise); `resume_placement`, where the migration stage
    resumes a paused program (`home_if_room`: its previous backend when that has room now,
    else the most room; `tier_aware`: where its host tier holds its context unless a move
    pays; a file that does not say ran `home_if_room`); `idle_fate`, what an idle program's
    reservation counts (`weight` or `min_waste`; a file that does not say ran `weight`);
    `tier_reload`, whether admission prices an overflow the host tier holds at its reload
    (`on` / `off`; a file that does not say ran `off`); `idle_engine`, whether an engine
    with no call in flight admits the queue's head past the watermark (`admit` / `hold`; a
    file that does not say ran `hold`); `recompute_overflow`, whether an engine is filled
    past its limit with KV to recompute and its controller probes past it (`on` / `off`;
    a file that does not say ran `on` unless its overflow was `hold`: with a host tier
    counted it is `on` whatever the flag says, with `hold` `off`). The three tier rules are
    recorded as they act: without a host tier they change nothing, and are recorded off."""
    rules: dict[str, dict[str, str]] = {
        "admission_overflow": {},
        "pause_victim": {},
        "queue_order": {},
        "resume_placement": {},
        "idle_fate": {},
        "tier_reload": {},
        "idle_engine": {},
        "recompute_overflow": {},
    }
    for policy in policies:
        tiered = "host_kv_tokens" in dict(engine_options(scenario, policy))
        for stage in POLICIES[policy]:
            if "admission" in stage:
                admission = AdmissionParams(**stage["admission"])
                rules["admission_overflow"][policy] = admission.overflow
                reload = admission.tier_reload and admission.host_tier and tiered
                rules["tier_reload"][policy] = "on" if reload else "off"
                rules["idle_engine"][policy] = "admit" if admission.fill_idle_engine else "hold"
                # As AdmissionStage._recomputes decides it (a counted tier overflows anyway);
                # `hold` admits nothing past the limit whatever the flag says.
                overflows = admission.recompute_overflow or (admission.host_tier and tiered)
                overflows = overflows and admission.overflow != "hold"
                rules["recompute_overflow"][policy] = "on" if overflows else "off"
            if "state_aware_pause" in stage:
                pause = PauseParams(**stage["state_aware_pause"])
                rule = pause_rule(pause.victim, pause.drain_victim, tiered)
                rules["pause_victim"][policy] = rule
                fate = pause.idle_fate
                if fate == "tiered_min_waste":
                    fate = "min_waste" if tiered else "weight"
                rules["idle_fate"][policy] = fate
            if "migration" in stage:
                migration = MigrationParams(**stage["migration"])
                first = migration.started_first
                if first is None:
                    first = tiered
                rules["queue_order"][policy] = "started_first" if first else "arrival"
                placement = "tier_aware" if migration.tier_aware and tiered else "home_if_room"
                rules["resume_placement"][policy] = placement
    return rules


def cap_values(scenario: Scenario) -> list[int]:
    """vllm_capped's caps: the scenario's fractions of its concurrency, whole programs."""
    concurrency = scenario.concurrency
    return sorted({max(1, round(f * concurrency)) for f in scenario.caps if f < 1})


def scenario_config(
    scenario: Scenario,
    policies: list[str],
    work: list[Job],
    trace: Path | None,
    sweep: bool,
    total: int | None,
) -> dict[str, Any]:
    """The result document's `config`: what the scenario ran, and each policy's pipeline."""
    return {
        "workload": str(trace) if trace else scenario.workload,
        "engines": scenario.engines,
        "programs_per_engine": scenario.programs_per_engine,
        "concurrency": scenario.concurrency,
        "programs": work[0].programs
        if total
        else next(j.programs for j in work if j.main and not j.wave),
        "arrival": scenario.arrival,
        "total_factor": scenario.total_factor,
        "seeds": sorted({j.seed for j in work}),
        "split": scenario.split,
        "steady_factor": scenario.total_factor,
        "burst": scenario.burst,
        "engine_profiles": list(scenario.engine_profiles),
        "engine_kv_tokens": list(engine_kv_tokens(scenario)),
        "kv_tokens_per_engine": kv_tokens_of(scenario),
        "host_tier": {
            p: dict(engine_options(scenario, p)) for p in policies if engine_options(scenario, p)
        },
        # The policies whose costs were learned from the engine's counters (a rerun must
        # not mix those runs with runs that learned them from call timings).
        "engine_counters": {p: True for p in policies if engine_counters(scenario, p)},
        "profile": scenario.profile,
        "max_model_len": scenario.max_model_len,
        "cluster_defaults": asdict(ClusterConfig()),
        "sweep": [list(s) for s in scenario.sweep] if sweep and trace is None else [],
        "policies": {p: POLICIES[p] for p in policies},
        **resolved_rules(scenario, policies),
        "description": scenario.description,
    }


def lower_caps(scenario: Scenario, policies: list[str], rows: list[dict[str, Any]]) -> list[Job]:
    """The next cap down for the first capped policy whose best cap, on either figure, is
    the lowest it ran (half of it, at least one program per engine; none once that is
    run): its runs at that cap, as `plan_jobs` plans a cap's (every seed, both figures)."""
    main = (scenario.engines, scenario.programs_per_engine)
    for name in (p for p in policies if p in CAPPED):
        caps = choose_caps(scenario, policies, rows, name)
        if caps is None:
            continue
        ran = sorted({r["cap"] for r in rows if r["policy"] == name})
        lowest = ran[0]
        if lowest <= scenario.engines or lowest not in (caps["batch_cap"], caps["window_cap"]):
            continue
        cap = max(scenario.engines, lowest // 2)
        runs = [r for r in rows if r["policy"] == name and r["cap"] == lowest]
        return [
            Job(name, *main, r["programs"], True, r["seed"], r["wave"], cap)
            for r in sorted(runs, key=lambda r: (r["wave"], r["seed"]))
        ]
    return []


def _rows(done: list[tuple[Job, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per run: its job's keys and its metrics."""
    return [
        {
            "policy": job.policy,
            "engines": job.engines,
            "programs_per_engine": job.per_engine,
            "concurrency": job.engines * job.per_engine,
            "programs": job.programs,
            "main": job.main,
            "seed": job.seed,
            "wave": job.wave,
            "cap": job.cap,
            **out["metrics"],
        }
        for job, out in done
    ]


def _run_jobs(
    scenario: Scenario, work: list[Job], trace: Path | None, seed: int, jobs: int
) -> list[tuple[Job, dict[str, Any]]]:
    if jobs > 1 and len(work) > 1:
        portable = replace(scenario, targets=())  # targets hold closures; workers need none
        with ProcessPoolExecutor(max_workers=min(jobs, len(work))) as pool:
            futures = [pool.submit(run_job, portable, j, trace, seed) for j in work]
            return [f.result() for f in futures]
    return [run_job(scenario, j, trace, seed) for j in work]


@dataclass(frozen=True)
class Taken:
    """Where a scenario's runs come from besides running them: the file being replaced
    (`--rerun`) for the `reused` policies, and for the `shared` policies the main point's
    runs of the scenario it shares that point with (`Scenario.main_point_of`)."""

    reuse: dict[str, Any] | None = None
    reused: tuple[str, ...] = ()
    shared_file: dict[str, Any] | None = None
    shared: tuple[str, ...] = ()
    main_point: tuple[int, int] = (0, 0)


def _kept(taken: Taken, job: Job, seed: int) -> dict[str, Any] | None:
    """`job`'s run as the file being replaced holds it (its policy reused), or as the file of
    the scenario sharing this main point holds it (a run there, its policy agreeing): None
    where neither has it (it is to be run)."""
    sources = []
    if taken.reuse is not None and job.policy in taken.reused:
        sources.append(taken.reuse)
    at_main = (job.engines, job.per_engine) == taken.main_point
    if taken.shared_file is not None and job.policy in taken.shared and at_main:
        sources.append(taken.shared_file)
    for source in sources:
        try:
            return reused_output(source, job, seed)
        except ReuseError:
            continue
    return None


def shared_policies(
    scenario: Scenario, shared_file: dict[str, Any], config: dict[str, Any], policies: list[str]
) -> list[str]:
    """The policies whose main-point runs can be taken from `shared_file`, the result file
    of `scenario.main_point_of`: its configuration must be this one's but for the sweep,
    and each policy's pipeline, engines and rules as they are now (reuse.check_config); a
    line on stderr names why any other is run here."""
    source = scenario.main_point_of
    old = {**shared_file.get("config", {}), "sweep": config["sweep"]}
    try:
        check_config(old, config, [])
    except ReuseError as e:
        print(
            f"{scenario.name}: running its main point here ({source}'s file: {e})", file=sys.stderr
        )
        return []
    agreeing = []
    for policy in policies:
        try:
            check_config(old, config, [policy])
        except ReuseError as e:
            print(
                f"{scenario.name}: {policy} runs its main point here ({source}: {e})",
                file=sys.stderr,
            )
            continue
        agreeing.append(policy)
    return agreeing


def _run_down_the_grid(
    scenario: Scenario,
    policies: list[str],
    work: list[Job],
    done: list[tuple[Job, dict[str, Any]]],
    taken: Taken,
    trace: Path | None,
    seed: int,
    jobs: int,
) -> list[tuple[Job, dict[str, Any]]]:
    """`done` and the runs of `work`; then, while a capped policy's best cap is the lowest of
    its grid, its runs at the next cap down (`lower_caps`: what a user tuning the cap would
    try next) until the best is inside it. A cap the file being replaced (or the file of the
    scenario sharing the main point) has is taken from it, as its policy's other runs are."""
    while True:
        if work:
            done = done + _run_jobs(scenario, work, trace, seed, jobs)
        lower = lower_caps(scenario, policies, _rows(done))
        if not lower:
            return done
        work = []
        for job in lower:
            kept = _kept(taken, job, seed)
            if kept is None:
                work.append(job)
            else:
                done = [*done, (job, kept)]
        if work:
            step = lower[0]  # every job of a step down: one policy, one cap
            print(f"{step.policy}: best at its lowest cap, adding cap {step.cap}", file=sys.stderr)


def run_scenario(
    scenario: Scenario,
    policies: list[str],
    seed: int = 0,
    trace: Path | None = None,
    sweep: bool = True,
    jobs: int = 1,
    total: int | None = None,
    seeds: int | None = None,
    reuse: dict[str, Any] | None = None,
    rerun: set[str] | None = None,
    shared: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every policy on the main configuration (and the sweep): the result document. With
    `reuse` (an earlier result document of this scenario), only the `rerun` policies run;
    every other run is taken from it (benchmarks/reuse.py). With `shared` (the result
    document of `scenario.main_point_of`), the main point's runs it has are taken from it
    for every policy whose configuration there is this one's (`shared_policies`)."""
    started = time.perf_counter()
    planned = plan_jobs(scenario, policies, seed, sweep and trace is None, total, seeds)
    work = planned
    done: list[tuple[Job, dict[str, Any]]] = []
    taken = Taken(main_point=(scenario.engines, scenario.programs_per_engine))
    config = scenario_config(scenario, policies, planned, trace, sweep, total)
    if reuse is not None:
        reused = [p for p in policies if p not in (rerun or set())]
        check_config(reuse["config"], config, reused)
        done = [(j, reused_output(reuse, j, seed)) for j in work if j.policy in reused]
        work = [j for j in work if j.policy not in reused]
        taken = replace(taken, reuse=reuse, reused=tuple(reused))
    if shared is not None:
        sharing = shared_policies(scenario, shared, config, policies)
        taken = replace(taken, shared_file=shared, shared=tuple(sharing))
        from_shared = [(j, _kept(taken, j, seed)) for j in work]
        done += [(j, out) for j, out in from_shared if out is not None]
        work = [j for j, out in from_shared if out is None]
    done = _run_down_the_grid(scenario, policies, work, done, taken, trace, seed, jobs)

    all_rows = _rows(done)
    all_rows.sort(
        key=lambda r: (
            r["engines"],
            r["concurrency"],
            r["wave"],
            r["seed"],
            policies.index(r["policy"]),
            r["cap"] or 0,
        )
    )
    # A capped policy: the cap that was best per figure stands for it (the sweep is kept).
    all_caps = {
        name: caps
        for name in CAPPED
        if (caps := choose_caps(scenario, policies, all_rows, name)) is not None
    }
    sweep_rows = [r for r in all_rows if r["policy"] not in CAPPED]
    for name, caps in all_caps.items():
        sweep_rows += capped_rows(scenario, caps, all_rows, name)
    main: dict[str, dict[str, Any]] = {}
    for job, out in done:
        if not job.main or job.seed != seed or job.wave:
            continue
        if job.policy in CAPPED:
            chosen = all_caps.get(job.policy)
            if chosen is None or job.cap != chosen["window_cap"]:
                continue
        main[job.policy] = out
    for name, caps in all_caps.items():
        if name not in main and caps["uncapped"] in main:
            main[name] = main[caps["uncapped"]]  # no cap was best: the uncapped engine
    policies = [p for p in policies if p in main]
    results = [{"policy": p, **main[p]["metrics"]} for p in policies]
    for name, caps in all_caps.items():
        if name in policies:
            results[policies.index(name)]["cap"] = caps["window_cap"]
    by_policy = {r["policy"]: r for r in results}
    targets = [
        dict(zip(("value", "met"), t.check(by_policy), strict=True), target=t.name, goal=t.goal)
        for t in scenario.targets
    ]
    config = scenario_config(scenario, policies, planned, trace, sweep, total)
    report: dict[str, Any] = {
        "scenario": scenario.name,
        "mode": "des",
        "seed": seed,
        "seeds": config["seeds"],
        "config": config,
        "results": results,
        "targets": targets,
        "sweep": sweep_rows,
        "timeseries": {p: main[p]["timeseries"] for p in policies},
        "jct_s": {p: main[p]["jct_s"] for p in policies},
        "run_wall_s": {p: main[p]["wall_s"] for p in policies},
    }
    report.update(summarise_runs(scenario, policies, sweep_rows))
    report["figures"] = figures(scenario, policies, sweep_rows)
    keys = ("cap", "seed", "wave", "makespan_s", "steps_per_min_steady", "steady_programs_done")
    for name, caps in all_caps.items():
        caps["runs"] = [{k: r.get(k) for k in keys} for r in all_rows if r["policy"] == name]
        report[name] = caps
    if reuse is not None:
        # Their runs are the old file's: its wall time is theirs, this one the reruns'.
        report["reused"] = {"policies": list(taken.reused), "wall_s": reuse.get("wall_s")}
    if taken.shared:
        # The main point's runs of these policies are the other scenario's (its wall time).
        report["main_point_from"] = {
            "scenario": scenario.main_point_of,
            "policies": list(taken.shared),
            "wall_s": shared.get("wall_s") if shared else None,
        }
    report["wall_s"] = round(time.perf_counter() - started, 1)
    report["machine"] = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    return report


# ---------------------------------------------------------------------------------- output
TABLE_COLUMNS = (
    ("steps_per_min", "steps/min"),
    ("steps_per_min_steady", "steady"),
    ("output_tokens_per_s", "tok/s"),
    ("jct_mean_s", "jct"),
    ("jct_p95_s", "p95"),
    ("jct_p99_s", "p99"),
    ("jct_max_over_median", "max/med"),
    ("ttft_p99_s", "ttft99"),
    ("ttft_max_s", "ttftmax"),
    ("prefix_hit_rate", "hit"),
    ("recomputed_prefill_tokens", "recomp"),
    ("preemptions", "preempt"),
    ("paused_time_s", "held_s"),
    ("kv_imbalance", "imbal"),
    ("programs_completed", "done"),
    ("programs_failed", "fail"),
)


def format_table(report: dict[str, Any]) -> str:
    head = ["policy", *(label for _, label in TABLE_COLUMNS)]
    rows = [
        [r["policy"], *(_cell(r.get(key)) for key, _ in TABLE_COLUMNS)] for r in report["results"]
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    lines = [
        "  ".join(str(x).rjust(w) for x, w in zip(line, widths, strict=True))
        for line in [head, *rows]
    ]
    for t in report.get("targets", ()):
        verdict = "MET" if t["met"] else "MISSED"
        lines.append(f"target {t['target']} {t['goal']}: {t['value']} {verdict}")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}"
    return str(value)


def write_plots(report: dict[str, Any], stem: Path) -> list[Path]:
    """Throughput vs concurrency, JCT CDF, KV usage per engine over time (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots", file=sys.stderr)
        return []
    written: list[Path] = []
    policies = [r["policy"] for r in report["results"]]
    name = report["scenario"]

    engine_counts = sorted({r["engines"] for r in report["sweep"]})
    if report["sweep"]:
        fig, axes = plt.subplots(1, len(engine_counts), figsize=(5 * len(engine_counts), 4))
        axes = axes if len(engine_counts) > 1 else [axes]
        for ax, engines in zip(axes, engine_counts, strict=True):
            for policy in policies:
                rows = sorted(
                    (
                        r
                        for r in report["sweep"]
                        if r["engines"] == engines and r["policy"] == policy
                    ),
                    key=lambda r: r["concurrency"],
                )
                ax.plot(
                    [r["concurrency"] for r in rows],
                    [r["steps_per_min"] for r in rows],
                    marker="o",
                    label=policy,
                )
            ax.set_title(f"{name}: {engines} engines")
            ax.set_xlabel("concurrent programs")
            ax.set_ylabel("LLM steps / min")
            ax.grid(alpha=0.3)
            ax.legend()
        written.append(_save(fig, plt, stem.parent / f"{stem.name}-throughput.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in policies:
        jct = report["jct_s"][policy]
        if jct:
            ax.step(jct, [(i + 1) / len(jct) for i in range(len(jct))], where="post", label=policy)
    ax.set_title(f"{name}: job completion time CDF")
    ax.set_xlabel("JCT (s)")
    ax.set_ylabel("fraction of programs")
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, plt, stem.parent / f"{stem.name}-jct-cdf.png"))

    fig, axes = plt.subplots(len(policies), 1, figsize=(8, 2.2 * len(policies)), sharex=True)
    axes = axes if len(policies) > 1 else [axes]
    for ax, policy in zip(axes, policies, strict=True):
        series = report["timeseries"][policy]
        for engine, usage in series["kv_usage"].items():
            ax.plot(series["t_s"], usage, linewidth=0.8, label=engine)
        ax.set_ylabel("KV used")
        ax.set_ylim(0, 1.05)
        ax.set_title(policy, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=8, loc="lower right")
    axes[-1].set_xlabel("simulated time (s)")
    written.append(_save(fig, plt, stem.parent / f"{stem.name}-kv.png"))
    return written


def _save(fig: Any, plt: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
