"""The named scenarios of `thunder-mw bench`, the policies they compare, and their targets.

A scenario is a workload preset x a simulated fleet x a concurrency, run once per policy
(and per seed); some add a concurrency sweep. A policy is a name for a pipeline (the YAML
`policies:` list): thunder-mw's, the original's rules and the baselines users run
(policies/stages.py, policies/baselines.py), plus variants of thunder-mw's stage params
used to find which rule costs what (name them with `--policies`). A few baselines are
engine features rather than gateway rules (`offload`: engines with a host KV tier); their
engine options are in POLICY_ENGINE_OPTIONS.

The `paper-*`, `dynamo-minimax`, `cluster-scaling` and `hicache-batch192` scenarios
reproduce published setups: each carries the published figures (`Published`) that
`thunder-mw bench` puts next to the measured ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thunder_mw.schemas.pipeline_presets import DEFAULT_PIPELINE, VLLM_ROUTER_PROGRAM_PIPELINE
from thunder_mw.schemas.pipeline_presets import PRESETS as PIPELINE_PRESETS
from thunder_mw.sim.cost_model import get_profile

__all__ = [
    "CAPPED",
    "CAP_FRACTIONS",
    "DEFAULT_POLICIES",
    "DYNAMO",
    "FLEET_POLICIES",
    "LAUNCH",
    "MEASURED",
    "OFFLOAD_CAPPED",
    "PAPER",
    "POLICIES",
    "POLICY_ENGINE_OPTIONS",
    "PUBLISHED_SCENARIOS",
    "SCENARIOS",
    "SEEDS",
    "SINGLE_ENGINE_POLICIES",
    "STEADY_FACTOR",
    "TABLE2",
    "TEST_SCENARIOS",
    "TIERED_FLEET_POLICIES",
    "VLLM_CAPPED",
    "WINDOW_COMPLETIONS",
    "Published",
    "Scenario",
    "Target",
    "engine_kv_tokens",
    "kv_tokens_of",
]

DEFAULT_POLICIES = ("round_robin", "sticky", "thunderagent", "thunder-mw")
VLLM_CAPPED = "vllm_capped"
# The same client-side cap over engines with the host KV tier (the `offload` baseline's):
# what a user with that tier who also caps would run, the strongest tiered baseline.
OFFLOAD_CAPPED = "offload_capped"
# The policies run as a sweep of client-side caps, each the best cap per figure; the value
# is the uncapped run the sweep includes as its cap 1.0 (None: `vllm` on one engine, else
# `session_affinity`; figures._uncapped).
CAPPED: dict[str, str | None] = {VLLM_CAPPED: None, OFFLOAD_CAPPED: "offload"}
# The caps vllm_capped is swept over, as fractions of the scenario's concurrency; the
# uncapped engine (the scenario's `vllm` or `session_affinity` run) is the sweep's 1.0. Where
# the best is the lowest, `bench` goes on down by halves (bench_cli.lower_caps).
CAP_FRACTIONS = (0.25, 0.5, 0.75)


def _with_params(
    pipeline: list[dict[str, Any]], overrides: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """`pipeline` with some stages' params replaced (a stage named with dashes for its
    underscores: `state-aware-pause`)."""
    return [
        {name: {**params, **overrides.get(name.replace("_", "-"), {})}}
        for entry in pipeline
        for name, params in entry.items()
    ]


def _thunder_mw(**overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """The default pipeline with some stages' params replaced."""
    return _with_params(DEFAULT_PIPELINE, overrides)


def _thunder_mw_with(name: str, params: dict[str, Any], before: str) -> list[dict[str, Any]]:
    """The default pipeline with stage `name` added before stage `before`."""
    stages = _thunder_mw()
    at = next(i for i, entry in enumerate(stages) if before in entry)
    return [*stages[:at], {name: params}, *stages[at:]]


def _thunder_mw_without(name: str) -> list[dict[str, Any]]:
    return [entry for entry in _thunder_mw() if name not in entry]


# The fixed rules of 0.2.0 with no KV admitted past the watermark to recompute (the host
# tier's allowance stays): `tier-only-overflow`, with and without offload's engines.
_TIER_ONLY_OVERFLOW: dict[str, Any] = {"overflow": "cost_aware", "max_overflow": 0.0}

POLICIES: dict[str, list[dict[str, Any]]] = {
    **PIPELINE_PRESETS,
    # Affinity over engines that have a host KV tier (the tier is an engine option,
    # POLICY_ENGINE_OPTIONS): vLLM's offloading connector / LMCache / SGLang HiCache
    # behind a consistent-hashing router.
    "offload": [{"session_affinity": {}}],
    # Continuum: its TTL pins plus program-level FCFS in the engine's waiting queue (an
    # engine option, POLICY_ENGINE_OPTIONS), behind consistent hashing.
    "continuum": [{"session_affinity": {}}, {"continuum_ttl": {}}],
    # Plain vLLM behind a client-side concurrency cap (a semaphore, `n_concurrent`): the
    # engines see at most `cap` programs at once, the cap the best of a sweep per scenario
    # (bench_cli.py); consistent hashing places programs when there are several engines.
    VLLM_CAPPED: [{"session_affinity": {}}],
    OFFLOAD_CAPPED: [{"session_affinity": {}}],
    # Diagnostic variants of the default pipeline: one rule changed each.
    "thunder-mw/acting-0.5": _thunder_mw(**{"state-aware-pause": {"acting_token_weight": 0.5}}),
    "thunder-mw/acting-0": _thunder_mw(**{"state-aware-pause": {"acting_token_weight": 0.0}}),
    "thunder-mw/hw-1.0": _thunder_mw(admission={"high_watermark": 1.0, "low_watermark": 0.9}),
    "thunder-mw/no-hysteresis": _thunder_mw(
        admission={"high_watermark": 0.95, "low_watermark": 0.95}
    ),
    "thunder-mw/buffer-0": _thunder_mw(admission={"buffer_tokens_per_program": 0}),
    "thunder-mw/shortest-first": _thunder_mw(**{"state-aware-pause": {"victim": "shortest_first"}}),
    # Shortest first while new programs keep arriving, cost-benefit once they stop: the
    # default since 2026-12-02, named for the files that compared it with the one before.
    "thunder-mw/auto-victim": _thunder_mw(**{"state-aware-pause": {"victim": "auto"}}),
    # Once arrivals stop, one fixed order by arrival for pausing and resuming (Continuum's
    # program-level FCFS) instead of cost-benefit (docs/scheduling.md, "The drain's order").
    "thunder-mw/drain-fcfs": _thunder_mw(**{"state-aware-pause": {"drain_victim": "fcfs"}}),
    # The same order with programs not yet begun resumed before paused ones.
    "thunder-mw/drain-new-first": _thunder_mw(
        **{"state-aware-pause": {"drain_victim": "new_first"}}
    ),
    # The pause victim of 0.2.0 (cost-benefit whether or not programs keep arriving).
    "thunder-mw/cost-benefit": _thunder_mw(**{"state-aware-pause": {"victim": "cost_benefit"}}),
    "thunder-mw/no-home": _thunder_mw(migration={"prefer_home_backend": False}),
    "thunder-mw/fifo": _thunder_mw(migration={"placement": "most_room"}),
    # The vLLM router's resume order (the most recently queued first, no ageing; the
    # force-resume timeout still bounds a wait): what its program scheduler gains on the 8B
    # fleets comes from it (`vllm_router_program/bfd-resume`, docs/benchmarks.md).
    "thunder-mw/mru-resume": _thunder_mw(migration={"placement": "mru", "aging_s": 1e9}),
    # The vLLM router's stand-in with thunder-mw's resume order (largest first, ageing 60 s).
    "vllm_router_program/bfd-resume": _with_params(
        VLLM_ROUTER_PROGRAM_PIPELINE,
        {"migration": {"placement": "best_fit_decreasing", "aging_s": 60.0}},
    ),
    "thunder-mw/started-first": _thunder_mw(migration={"started_first": True}),
    # The admission before an idle engine admitted the queue's head past the watermark.
    "thunder-mw/hold-idle-engine": _thunder_mw(admission={"fill_idle_engine": False}),
    "thunder-mw/arrival-order": _thunder_mw(migration={"started_first": False}),
    "thunder-mw/yield-5s": _thunder_mw(**{"state-aware-pause": {"yield_idle_after_s": 5.0}}),
    # Ablations of issue 17's mechanisms (docs/scheduling.md), each against the default.
    # The fixed rules the controller replaced (the default until 0.2.0): the cost-aware
    # rule's allowance past the high watermark, no feedback on goodput.
    "thunder-mw/fixed": _thunder_mw(
        admission={"overflow": "cost_aware", "recompute_overflow": True}
    ),
    "thunder-mw/no-cost-aware": _thunder_mw(admission={"overflow": "hold"}),
    # The fixed rules admitting past the watermark only onto a host tier (no KV to recompute):
    # where the cost-aware allowance is what loses to holding (docs/benchmarks.md).
    "thunder-mw/tier-only-overflow": _thunder_mw(admission=_TIER_ONLY_OVERFLOW),
    # The default until 2026-12-07: an engine without a host tier is also filled past its
    # limit with KV to recompute, its controller probing past it (`recompute_overflow`; the
    # default is the two above together, per backend: no KV to recompute past the limit and
    # no controller where the engine has no tier, the controller where it has one).
    "thunder-mw/recompute-overflow": _thunder_mw(admission={"recompute_overflow": True}),
    # Nothing held at admission (no admission stage; pausing still keeps the engine under
    # capacity): where recompute is cheap, what a controller at its ceiling would reach; where
    # it is dear, what holding earns.
    "thunder-mw/no-admission": _thunder_mw_without("admission"),
    # docs/scheduling.md, "Shared prefixes counted once" and "Which call pauses": off by
    # default (each lost on some published setup).
    "thunder-mw/shared-prefix": _thunder_mw(admission={"shared_prefix": True}),
    "thunder-mw/smallest-victim": _thunder_mw(
        **{"state-aware-pause": {"reasoning_victim": "smallest"}}
    ),
    "thunder-mw/shared-prefix+smallest-victim": _thunder_mw(
        admission={"shared_prefix": True},
        **{"state-aware-pause": {"reasoning_victim": "smallest"}},
    ),
    "thunder-mw/no-host-tier": _thunder_mw(admission={"host_tier": False}),
    # The default pipeline in front of the engines `offload` runs on (the host KV tier,
    # POLICY_ENGINE_OPTIONS): what a user with that tier would deploy, the same hardware
    # as the `offload` baseline. Its tier rules (tier-aware placement, the min-waste idle
    # fate on tiered backends) price a reload against a recompute from the engine's
    # counters, as live learns them.
    "thunder-mw/host-tier": _thunder_mw(),
    # Their ablation: the same engines with the rules before them (resume wherever there
    # is room, idle contexts at the acting weight).
    "thunder-mw/tier-fixed-rules": _thunder_mw(
        migration={"tier_aware": False}, **{"state-aware-pause": {"idle_fate": "weight"}}
    ),
    # The default on the tier with admission pricing an overflow the tier holds at its
    # reload alone, the GPU's caps on calls in flight lifted (`tier_reload`, opt-in).
    "thunder-mw/tier-reload": _thunder_mw(admission={"tier_reload": True}),
    # `drain-fcfs` and `drain-new-first` on the same engines.
    "thunder-mw/host-tier+drain-fcfs": _thunder_mw(
        **{"state-aware-pause": {"drain_victim": "fcfs"}}
    ),
    "thunder-mw/host-tier+drain-new-first": _thunder_mw(
        **{"state-aware-pause": {"drain_victim": "new_first"}}
    ),
    # The router's resume order (`mru-resume`: the program queued last resumes first, no
    # ageing) on the same engines: the host tier's LRU still holds the context of the
    # program paused last, and has lost first that of the one paused first.
    "thunder-mw/host-tier+mru-resume": _thunder_mw(migration={"placement": "mru", "aging_s": 1e9}),
    # `tier-only-overflow` on the same engines.
    "thunder-mw/host-tier+tier-only-overflow": _thunder_mw(admission=_TIER_ONLY_OVERFLOW),
    # The rule before min-waste became the default (2026-12-04): an ACTING program's
    # reservation at `acting_token_weight` on backends without a host tier.
    "thunder-mw/tiered-min-waste": _thunder_mw(
        **{"state-aware-pause": {"idle_fate": "tiered_min_waste"}}
    ),
    # The default pipeline pricing recompute from call timings (time to first token, the
    # engine's queue included, which overstates it; POLICY_ENGINE_OPTIONS), as the
    # simulator's rows did before they read the engine's counters as live does.
    "thunder-mw/call-timings": _thunder_mw(),
    "thunder-mw/resident": _thunder_mw(admission={"resident_floor": 0.5}),
    "thunder-mw/hw-1.0+acting-0.5": _thunder_mw(
        admission={"high_watermark": 1.0, "low_watermark": 0.9},
        **{"state-aware-pause": {"acting_token_weight": 0.5}},
    ),
    # Issue 17's mechanisms, one row each against the default pipeline: warming every
    # program (the default warms only programs whose agent hint asks), none at all (no
    # stage: the hint is ignored), and KV-aware placement of new programs (off by default).
    "thunder-mw/spec-prefill": _thunder_mw(**{"speculative-prefill": {"default": True}}),
    "thunder-mw/no-spec-prefill": _thunder_mw_without("speculative_prefill"),
    "thunder-mw/kv-placement": _thunder_mw_with("kv_placement", {}, "migration"),
    "thunder-mw/hw-1.0+acting-0": _thunder_mw(
        admission={"high_watermark": 1.0, "low_watermark": 0.9},
        **{"state-aware-pause": {"acting_token_weight": 0.0}},
    ),
}


# Engine options a policy brings with it (merged over the scenario's): `host_tier` gives
# every engine the host KV tier the scenario sizes (`host_kv_tokens`); `engine_counters`
# says whether the simulator's scrapes carry the engine's prefill and decode counters, as
# live scrapes do (ClusterConfig.engine_counters): on for thunder-mw's pipelines unless
# their options say otherwise, off for the baselines, which price nothing (the scenario's
# `engine_counters` turns it on for every policy; bench_cli.engine_counters).
POLICY_ENGINE_OPTIONS: dict[str, dict[str, Any]] = {
    "offload": {"host_tier": True},
    OFFLOAD_CAPPED: {"host_tier": True},
    "thunder-mw/host-tier": {"host_tier": True},
    "thunder-mw/tier-fixed-rules": {"host_tier": True},
    "thunder-mw/tier-reload": {"host_tier": True},
    "thunder-mw/host-tier+tier-only-overflow": {"host_tier": True},
    "thunder-mw/host-tier+drain-fcfs": {"host_tier": True},
    "thunder-mw/host-tier+drain-new-first": {"host_tier": True},
    "thunder-mw/host-tier+mru-resume": {"host_tier": True},
    "thunder-mw/call-timings": {"engine_counters": False},
    "continuum": {"program_fcfs": True},
}


@dataclass(frozen=True, slots=True)
class Published:
    """A published figure a scenario reproduces: `policy` over `baseline` on `metric`."""

    figure: str  # what the source shows, in its words
    source: str  # where (paper section, post)
    ratio: float  # the published ratio (policy / baseline)
    policy: str = "thunderagent"  # the simulator's stand-in for the system measured
    baseline: str = "vllm"  # the simulator's stand-in for what it was measured against
    metric: str = "steps_per_min_steady"
    engines: int | None = None  # the fleet size it belongs to (None: the main point)
    programs_per_engine: int | None = None
    absolute: tuple[float, float] | None = None  # (policy, baseline) in the source's unit
    unit: str = ""


@dataclass(frozen=True, slots=True)
class Target:
    """A goal the scheduler must meet in a scenario: `check(results_by_policy)` -> value, met."""

    name: str
    goal: str
    check: Callable[[dict[str, dict[str, Any]]], tuple[float | None, bool]]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    workload: str  # a preset of benchmarks/workloads.py
    engines: int
    programs_per_engine: int  # concurrent programs (closed loop) per engine
    # Programs run in all = concurrency x this. 1.0 = one wave, all started at t=0: an RL
    # rollout batch, measured by the time to finish it (longer closed loops cost minutes).
    total_factor: float = 1.0
    sweep_factor: float = 1.0  # the same for the sweep's points
    kv_tokens: int | None = 131_072  # None: the cost profile's own capacity
    profile: str = "h100-8b"
    max_model_len: int = 65_536
    arrival: str = "closed"
    policies: tuple[str, ...] = DEFAULT_POLICIES
    sweep: tuple[tuple[int, int], ...] = ()  # (engines, programs per engine), besides the main
    targets: tuple[Target, ...] = ()
    notes: dict[str, Any] = field(default_factory=dict)
    # "sim": simulated engines (des or live mode); "vllm-cpu": one REAL vLLM CPU engine
    # (benchmarks/vllm_real.py), whose preset is scaled down to the tiny model by these:
    engine: str = "sim"
    token_scale: float = 1.0  # every token count of the preset x this
    tool_time_scale: float = 1.0  # every time of the preset (tools, start-up) x this
    max_tool_s: float | None = None  # clip on the scaled tool time
    # Steady state (closed loop, total_factor > 1): seeds of the main point (and of the sweep
    # when sweep_seeds), and whether to add the one-wave (RL batch) run per policy, seed 0.
    seeds: int = 1
    sweep_seeds: bool = False
    wave: bool = False
    host_kv_tokens: int | None = None  # host KV tier per engine (every policy; None: none)
    host_tier: bool = False  # every policy's engines have the host tier
    # Every policy's scrapes carry the engine's cost counters (ClusterConfig.engine_counters;
    # `thunder-mw bench --engine-counters`).
    engine_counters: bool = False
    # Scale-down for wall time: KV tokens per engine = the profile's capacity x this, with
    # the programs per engine scaled alike (resident contexts / capacity unchanged).
    kv_scale: float = 1.0
    # Steady runs end when the window closes (the drain after it measures nothing steady);
    # their JCT figures cover the programs finished by then, the wave run has the whole tail.
    stop_at_window_end: bool = False
    published: tuple[Published, ...] = ()
    # "tuning": thunder-mw's defaults were chosen on it; "test": no default was (reported
    # apart, docs/benchmarks.md).
    split: str = "tuning"
    burst: int = 1  # closed loop refilled in bursts of this many programs (des.Arrivals)
    # A mixed fleet: one cost profile per engine (each with its own KV capacity).
    engine_profiles: tuple[str, ...] = ()
    caps: tuple[float, ...] = CAP_FRACTIONS  # vllm_capped's sweep (fractions of concurrency)
    # Another scenario whose main point this one's is (same workload, engines, seeds and
    # policies): `thunder-mw bench` takes those runs from its result file where the
    # configurations agree, rather than run them a second time (bench_cli `run_scenario`).
    main_point_of: str | None = None

    @property
    def concurrency(self) -> int:
        return self.engines * self.programs_per_engine


# Closed loop: each run starts concurrency x STEADY_FACTOR programs; the window opens when
# half the concurrency has finished and closes at the last start, with exactly
# (STEADY_FACTOR - 1.5) x concurrency completions inside it: 4x, the long window (in-flight
# calls count pro rata at both cuts, des.Arrivals). The paper's axis is the same: a fixed
# number of programs in flight, each replaced when it ends.
STEADY_FACTOR = 5.5
WINDOW_COMPLETIONS = 4.0  # completions inside the window, x the concurrency (at least)
SEEDS = 5
SINGLE_ENGINE_POLICIES = (
    "vllm",
    VLLM_CAPPED,
    "continuum",
    "offload",
    "vllm_router_program",
    "thunderagent",
    "thunder-mw",
)
# A fleet routes: plain vLLM's place is taken by the two routers users put in front of it.
FLEET_POLICIES = ("session_affinity", "kv_aware", *SINGLE_ENGINE_POLICIES[1:])
# The 8B fleets, with the client-side cap over the tiered engines too (offload_capped).
_AT = FLEET_POLICIES.index("offload") + 1
TIERED_FLEET_POLICIES = (*FLEET_POLICIES[:_AT], OFFLOAD_CAPPED, *FLEET_POLICIES[_AT:])


# The two headline figures: the fixed batch (`wave`) and the long window, over SEEDS seeds.
MEASURED: dict[str, Any] = dict(
    total_factor=STEADY_FACTOR,
    sweep_factor=STEADY_FACTOR,
    seeds=SEEDS,
    wave=True,
    stop_at_window_end=True,
)


def _fleet_8b(name: str, description: str, workload: str, per_engine: int, **kw: Any) -> Scenario:
    """Four 8B H100 engines past (or below) the KV knee, measured as the published setups
    are, against every strong baseline."""
    return Scenario(
        name=name,
        description=description,
        workload=workload,
        engines=4,
        programs_per_engine=per_engine,
        policies=TIERED_FLEET_POLICIES,
        **MEASURED,
        **kw,
    )


SCENARIOS: dict[str, Scenario] = {
    "live-small": Scenario(
        name="live-small",
        description="a small swe-agent wave past the knee on 2 engines, small enough to run "
        "live (the real gateway over HTTP) and check it against the simulation",
        workload="swe-agent",
        engines=2,
        programs_per_engine=6,
        kv_tokens=32_768,
        max_model_len=16_384,
        arrival="batch",
        policies=("round_robin", "thunder-mw"),
    ),
    # ONE real vLLM CPU engine in two regimes (benchmarks/vllm_real.py): 4 equal-length programs
    # whose contexts peak at ~8.3 k tokens together on 25 blocks x 128 (3,200 tokens): ~2.6x
    # the KV cache, all live at once (the smallest wave that overflows by construction and
    # leaves a client-side cap something to choose: 8 systems x 5 runs fit in ~14 minutes).
    # Its policies are the systems of vllm_real.SYSTEMS ("direct/cap": the client-side cap
    # the simulator finds best).
    "vllm-cpu-real": Scenario(
        name="vllm-cpu-real",
        description="a wave of agent programs overflowing ONE real vLLM CPU engine's KV cache "
        "~2.6x, in a cheap-recompute and a dear-recompute regime; prefix hits and preemptions "
        "read from the engine's own counters, each system beside the simulator's prediction",
        workload="cpu-overflow",
        engines=1,
        programs_per_engine=4,
        kv_tokens=25 * 128,
        # vLLM refuses a max_model_len its usable blocks (one is its null block) cannot hold.
        max_model_len=24 * 128,
        arrival="batch",
        policies=(
            "direct",
            "direct/cap",
            "thunder-mw",
            "thunderagent",
            "vllm-router/program",
            "smg/consistent_hashing",
            "smg/cache_aware",
            "thunder-mw/routing-only",
        ),
        engine="vllm-cpu",
    ),
    # The 8B fleet scenarios, measured as the published ones are (both figures, 5 seeds,
    # every strong baseline): 4 H100 engines of 131 k KV tokens each.
    "swe-agent-knee": _fleet_8b(
        "swe-agent-knee",
        "mini-SWE-agent programs past the KV capacity knee on 4 engines",
        "swe-agent",
        48,
        sweep=((4, 16), (4, 32)),
    ),
    "tool-orchestra-knee": _fleet_8b(
        "tool-orchestra-knee",
        "orchestrator programs with long remote tool calls past the knee, 4 engines",
        "tool-orchestra",
        96,
        sweep=((4, 32), (4, 64)),
    ),
    # Below the knee (0.26x capacity): nothing to gain, so scheduling must cost nothing.
    "chat-control": _fleet_8b(
        "chat-control",
        "short multi-turn chats below the knee: scheduling must cost nothing",
        "chat",
        32,
    ),
}


# ------------------------------------------------------------------ published setups
# Figures from the issue that asks for them (ThunderAgent, arXiv 2602.13692 §5, Figure 4 and
# Table 2; its launch post; Dynamo's port), quoted there from the sources. Figure 4's labels
# at the highest concurrency read as ThunderAgent / vLLM and Continuum / vLLM.
PAPER = "ThunderAgent, arXiv 2602.13692, §5 Figure 4 (highest concurrency)"
TABLE2 = "ThunderAgent, arXiv 2602.13692, §5 Table 2 (RL rollout, 144 programs, 2x 8xH100)"
LAUNCH = "ThunderAgent launch post (Together AI)"
DYNAMO = "Dynamo's port of the ThunderAgent scheduler, 2x TP4 MiniMax-M2 on one 8xH100 node"


def _figure4(label: str, thunder: float, continuum: float) -> tuple[Published, ...]:
    return (
        Published(f"Figure 4, {label}: ThunderAgent / vLLM", PAPER, thunder),
        Published(f"Figure 4, {label}: Continuum / vLLM", PAPER, continuum, policy="continuum"),
    )


def _paper(name: str, description: str, workload: str, profile: str, **kw: Any) -> Scenario:
    """One engine, the Figure 4 concurrency sweep (24/48/72/96 programs), steady state."""
    defaults: dict[str, Any] = dict(
        name=name,
        description=description,
        workload=workload,
        engines=1,
        programs_per_engine=96,
        sweep=((1, 24), (1, 48), (1, 72)),
        kv_tokens=None,
        profile=profile,
        max_model_len=131_072,
        policies=SINGLE_ENGINE_POLICIES,
        **MEASURED,
    )
    defaults.update(kw)
    return Scenario(**defaults)


PUBLISHED_SCENARIOS: dict[str, Scenario] = {
    "paper-swe-glm46": _paper(
        "paper-swe-glm46",
        "mini-SWE-agent on GLM-4.6 FP8, TP8 on one 8xH100 node, 24-96 programs (Figure 4)",
        "mini-swe-agent-glm46",
        "h100x8-glm46-fp8",
        published=_figure4("SWE-agent-GLM4.6", 2.65, 1.52),
    ),
    "paper-openhands-glm46": _paper(
        "paper-openhands-glm46",
        "OpenHands on GLM-4.6 FP8, TP8 on one 8xH100 node, 24-96 programs (Figure 4)",
        "openhands-glm46",
        "h100x8-glm46-fp8",
        published=_figure4("OpenHands-GLM4.6", 3.58, 1.08),
    ),
    "paper-toolorchestra-qwen3-8b": _paper(
        "paper-toolorchestra-qwen3-8b",
        "ToolOrchestra orchestrator on Qwen3-8B FP16 on one RTX 5090, 24-96 programs (Figure 4)",
        "toolorchestra-qwen3-8b",
        "rtx5090-qwen3-8b",
        max_model_len=40_960,
        published=_figure4("ToolOrchestra-Qwen3-8B", 1.48, 0.65),
    ),
    "paper-rollout-2node": Scenario(
        name="paper-rollout-2node",
        description="RL rollout: 144 mini-SWE-agent programs on two GLM-4.6 8xH100 engines, "
        "against a KV-aware gateway (Table 2's vLLM + SGLang gateway)",
        workload="mini-swe-agent-glm46",
        engines=2,
        programs_per_engine=72,
        total_factor=STEADY_FACTOR,
        kv_tokens=None,
        profile="h100x8-glm46-fp8",
        max_model_len=131_072,
        policies=FLEET_POLICIES,
        seeds=SEEDS,
        wave=True,
        stop_at_window_end=True,
        published=(
            Published(
                "Table 2, mini-SWE-agent: ThunderAgent / vLLM + SGLang gateway (steps/min)",
                TABLE2,
                671.8 / 375.4,
                baseline="kv_aware",
                absolute=(671.8, 375.4),
                unit="steps/min",
            ),
        ),
    ),
    "paper-rollout-2node-openhands": Scenario(
        name="paper-rollout-2node-openhands",
        description="RL rollout: 144 OpenHands programs on two GLM-4.6 8xH100 engines, "
        "against a KV-aware gateway (Table 2)",
        workload="openhands-glm46",
        engines=2,
        programs_per_engine=72,
        total_factor=STEADY_FACTOR,
        kv_tokens=None,
        profile="h100x8-glm46-fp8",
        max_model_len=131_072,
        policies=FLEET_POLICIES,
        seeds=SEEDS,
        wave=True,
        stop_at_window_end=True,
        published=(
            Published(
                "Table 2, OpenHands: ThunderAgent / vLLM + SGLang gateway (steps/min)",
                TABLE2,
                270.8 / 69.1,
                baseline="kv_aware",
                absolute=(270.8, 69.1),
                unit="steps/min",
            ),
        ),
    ),
    "dynamo-minimax": Scenario(
        name="dynamo-minimax",
        description="SWE-bench-Lite agents on two TP4 MiniMax-M2 FP8 replicas of one 8xH100 "
        "node, against a KV-aware router (Dynamo's KvRouter)",
        workload="swe-agent-minimax-m2",
        engines=2,
        programs_per_engine=48,
        sweep=((2, 16), (2, 32), (2, 64)),
        total_factor=STEADY_FACTOR,
        sweep_factor=STEADY_FACTOR,
        kv_tokens=None,
        profile="h100x4-minimax-m2-fp8",
        max_model_len=131_072,
        policies=FLEET_POLICIES,
        seeds=SEEDS,
        wave=True,
        stop_at_window_end=True,
        published=(
            Published(
                "ThunderAgent scheduler in Dynamo / Dynamo KvRouter: +12-16 % (midpoint)",
                DYNAMO,
                1.14,
                baseline="kv_aware",
            ),
        ),
    ),
    "cluster-scaling": Scenario(
        name="cluster-scaling",
        description="mini-SWE-agent on 2, 4 and 8 GLM-4.6 8xH100 engines (16-64 GPUs), "
        "72 programs per engine as Table 2, at full size, against every strong baseline",
        workload="mini-swe-agent-glm46",
        engines=2,
        programs_per_engine=72,
        sweep=((4, 72), (8, 72)),
        main_point_of="paper-rollout-2node",
        total_factor=STEADY_FACTOR,
        sweep_factor=STEADY_FACTOR,
        kv_tokens=None,
        profile="h100x8-glm46-fp8",
        max_model_len=131_072,
        policies=FLEET_POLICIES,
        seeds=SEEDS,
        sweep_seeds=True,
        wave=True,
        stop_at_window_end=True,
        published=(
            Published(
                "16 GPUs: ThunderAgent / SGLang gateway",
                LAUNCH,
                1.79,
                baseline="kv_aware",
                engines=2,
                absolute=(671.0, 671.0 / 1.79),
                unit="steps/min",
            ),
            Published(
                "64 GPUs: ThunderAgent / SGLang gateway",
                LAUNCH,
                2.39,
                baseline="kv_aware",
                engines=8,
                absolute=(2248.0, 2248.0 / 2.39),
                unit="steps/min",
            ),
        ),
    ),
    "hicache-batch192": Scenario(
        name="hicache-batch192",
        description="192 mini-SWE-agent programs on one GLM-4.6 8xH100 engine with a host KV "
        "tier (SGLang HiCache), every policy on the same tiered engine",
        workload="mini-swe-agent-glm46",
        engines=1,
        programs_per_engine=192,
        total_factor=STEADY_FACTOR,
        kv_tokens=None,
        profile="h100x8-glm46-fp8",
        max_model_len=131_072,
        host_tier=True,
        policies=(
            "offload",
            VLLM_CAPPED,
            "continuum",
            "vllm_router_program",
            "thunderagent",
            "thunder-mw",
        ),
        seeds=SEEDS,
        wave=True,
        stop_at_window_end=True,
        published=(
            Published(
                "batch 192 with HiCache: ThunderAgent / SGLang, output tok/s",
                LAUNCH,
                803 / 390,
                baseline="offload",
                metric="output_tokens_per_s_steady",
                absolute=(803.0, 390.0),
                unit="tok/s",
            ),
        ),
    ),
}
SCENARIOS.update(PUBLISHED_SCENARIOS)


# ------------------------------------------------------------------ test regimes
# No default of thunder-mw was chosen on these (docs/benchmarks.md, "Tuning and test sets"):
# they were added after the defaults were fixed, with sizes chosen before any run.
TEST_SCENARIOS: dict[str, Scenario] = {
    "test-mixed-fleet": Scenario(
        name="test-mixed-fleet",
        description="one 8B model on a mixed fleet: an H100 engine (467 k KV tokens) beside "
        "an RTX 5090 engine (98 k), 48 mini-SWE-agent programs per engine",
        workload="swe-agent",
        engines=2,
        programs_per_engine=48,
        engine_profiles=("h100-8b", "rtx5090-qwen3-8b"),
        total_factor=STEADY_FACTOR,
        kv_tokens=None,
        profile="h100-8b",
        max_model_len=40_960,
        policies=(
            "session_affinity",
            "kv_aware",
            VLLM_CAPPED,
            "continuum",
            "vllm_router_program",
            "thunderagent",
            "thunder-mw",
        ),
        seeds=SEEDS,
        wave=True,
        stop_at_window_end=True,
        split="test",
    ),
    "test-swe-orchestra-mix": Scenario(
        name="test-swe-orchestra-mix",
        description="SWE-agent and tool-orchestration programs mixed in one run (alternate "
        "programs), 48 per engine on two H100 8B engines of 131 k KV tokens",
        workload="mix:swe-agent+tool-orchestra",
        engines=2,
        programs_per_engine=48,
        total_factor=STEADY_FACTOR,
        kv_tokens=131_072,
        profile="h100-8b",
        max_model_len=65_536,
        policies=TIERED_FLEET_POLICIES,
        seeds=SEEDS,
        wave=True,
        stop_at_window_end=True,
        split="test",
    ),
    "test-bursty-swe-glm46": _paper(
        "test-bursty-swe-glm46",
        "paper-swe-glm46's engine and programs, the closed loop refilled in bursts of 24 "
        "(a quarter of the concurrency started at one instant)",
        "mini-swe-agent-glm46",
        "h100x8-glm46-fp8",
        sweep=(),
        burst=24,
        split="test",
    ),
}
SCENARIOS.update(TEST_SCENARIOS)


# ------------------------------------------------------------------ KV tokens per engine
def _profile_kv(scenario: Scenario, profile: str) -> int:
    capacity = get_profile(profile).capacity_tokens
    if not capacity:
        raise ValueError(f"{scenario.name}: profile {profile!r} has no KV capacity")
    return int(capacity * scenario.kv_scale)


def kv_tokens_of(scenario: Scenario) -> int:
    """KV tokens per engine: the scenario's, else its cost profile's own capacity (a mixed
    fleet: its first engine's; `engine_kv_tokens` has each)."""
    if scenario.kv_tokens is not None:
        return scenario.kv_tokens
    return _profile_kv(scenario, (scenario.engine_profiles or (scenario.profile,))[0])


def engine_kv_tokens(scenario: Scenario) -> tuple[int, ...]:
    """A mixed fleet's KV tokens per engine (empty for a uniform fleet)."""
    if not scenario.engine_profiles:
        return ()
    return tuple(scenario.kv_tokens or _profile_kv(scenario, p) for p in scenario.engine_profiles)
