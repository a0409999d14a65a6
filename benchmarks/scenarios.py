"""The named scenarios of `thunder-mw bench`, the policies they compare, and their targets.

A scenario is a workload preset x a simulated fleet x a concurrency, run once per policy;
some add a concurrency sweep. A policy is a name for a pipeline (the YAML `policies:`
list): the presets of policies/stages.py, plus variants of thunder-mw's stage params used
to find which rule costs what (name them with `--policies`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thunder_mw.policies.stages import PRESETS as PIPELINE_PRESETS

DEFAULT_POLICIES = ("round_robin", "sticky", "thunderagent", "thunder-mw")


def _thunder_mw(**overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """The default pipeline with some stages' params replaced."""
    stages = ("admission", "state_aware_pause", "migration", "gc_hooks")
    return [{name: dict(overrides.get(name.replace("_", "-"), {}))} for name in stages]


POLICIES: dict[str, list[dict[str, Any]]] = {
    **PIPELINE_PRESETS,
    # Diagnostic variants of the default pipeline: one rule changed each.
    "thunder-mw/acting-0.5": _thunder_mw(**{"state-aware-pause": {"acting_token_weight": 0.5}}),
    "thunder-mw/acting-0": _thunder_mw(**{"state-aware-pause": {"acting_token_weight": 0.0}}),
    "thunder-mw/hw-1.0": _thunder_mw(admission={"high_watermark": 1.0, "low_watermark": 0.9}),
    "thunder-mw/no-hysteresis": _thunder_mw(
        admission={"high_watermark": 0.95, "low_watermark": 0.95}
    ),
    "thunder-mw/buffer-0": _thunder_mw(admission={"buffer_tokens_per_program": 0}),
    "thunder-mw/shortest-first": _thunder_mw(**{"state-aware-pause": {"victim": "shortest_first"}}),
    "thunder-mw/no-home": _thunder_mw(migration={"prefer_home_backend": False}),
    "thunder-mw/fifo": _thunder_mw(migration={"placement": "most_room"}),
    "thunder-mw/yield-5s": _thunder_mw(**{"state-aware-pause": {"yield_idle_after_s": 5.0}}),
    "thunder-mw/hw-1.0+acting-0.5": _thunder_mw(
        admission={"high_watermark": 1.0, "low_watermark": 0.9},
        **{"state-aware-pause": {"acting_token_weight": 0.5}},
    ),
    "thunder-mw/hw-1.0+acting-0": _thunder_mw(
        admission={"high_watermark": 1.0, "low_watermark": 0.9},
        **{"state-aware-pause": {"acting_token_weight": 0.0}},
    ),
}


@dataclass(frozen=True, slots=True)
class Target:
    """A goal the scheduler must meet in a scenario: `check(results_by_policy)` -> value, met."""

    name: str
    goal: str
    check: Callable[[dict[str, dict[str, Any]]], tuple[float | None, bool]]


def _ratio(policy: str, baseline: str, metric: str, at_least: float) -> Callable[..., Any]:
    def check(results: dict[str, dict[str, Any]]) -> tuple[float | None, bool]:
        if policy not in results or baseline not in results:
            return None, False
        base = results[baseline][metric]
        value = results[policy][metric] / base if base else None
        return (None, False) if value is None else (round(value, 3), value >= at_least)

    return check


def _within(policy: str, baseline: str, metric: str, tolerance: float) -> Callable[..., Any]:
    def check(results: dict[str, dict[str, Any]]) -> tuple[float | None, bool]:
        if policy not in results or baseline not in results:
            return None, False
        base = results[baseline][metric]
        value = results[policy][metric] / base if base else None
        if value is None:
            return None, False
        return round(value, 4), value >= 1 - tolerance

    return check


def _metric(
    policy: str, metric: str, at_most: float | None = None, at_least: float | None = None
) -> Callable[[dict[str, dict[str, Any]]], tuple[float | None, bool]]:
    def check(results: dict[str, dict[str, Any]]) -> tuple[float | None, bool]:
        value = results.get(policy, {}).get(metric)
        if value is None:
            return None, False
        ok = (at_most is None or value <= at_most) and (at_least is None or value >= at_least)
        return value, ok

    return check


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
    kv_tokens: int = 131_072
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

    @property
    def concurrency(self) -> int:
        return self.engines * self.programs_per_engine


_KNEE_TARGETS = (
    Target(
        "steps/min vs round_robin",
        ">= 1.5x",
        _ratio("thunder-mw", "round_robin", "steps_per_min", 1.5),
    ),
    Target(
        "steps/min vs thunderagent",
        ">= 1.0x (aim 1.1x)",
        _ratio("thunder-mw", "thunderagent", "steps_per_min", 1.0),
    ),
    Target(
        "no starvation: max JCT / median", "<= 3", _metric("thunder-mw", "jct_max_over_median", 3)
    ),
    Target("prefix hit rate", ">= 0.85", _metric("thunder-mw", "prefix_hit_rate", at_least=0.85)),
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
    # swe-agent-knee shrunk 8x in tokens and time for the tiny model on 2 CPU cores: its 48
    # programs on 131 k KV tokens per engine need ~2.9x the KV they have; here 8 programs need
    # ~9.9 k tokens at their peaks on 24 blocks x 128 = 3 k (~3.2x). See benchmarks/README.md.
    "vllm-cpu-real": Scenario(
        name="vllm-cpu-real",
        description="scaled swe-agent wave overflowing ONE real vLLM CPU engine's KV cache; "
        "prefix hits and preemptions read from the engine's own counters",
        workload="swe-agent",
        engines=1,
        programs_per_engine=8,
        kv_tokens=3072,  # 24 blocks of 128, as the tests' engine
        max_model_len=2048,
        arrival="batch",
        policies=("round_robin", "thunder-mw"),
        engine="vllm-cpu",
        token_scale=1 / 8,
        tool_time_scale=1 / 8,
        max_tool_s=5.0,
    ),
    "swe-agent-knee": Scenario(
        name="swe-agent-knee",
        description="mini-SWE-agent programs past the KV capacity knee on 4 engines",
        workload="swe-agent",
        engines=4,
        programs_per_engine=48,
        sweep=((4, 16), (4, 32), (8, 16), (8, 24)),
        targets=_KNEE_TARGETS,
    ),
    "tool-orchestra-knee": Scenario(
        name="tool-orchestra-knee",
        description="orchestrator programs with long remote tool calls past the knee, 4 engines",
        workload="tool-orchestra",
        engines=4,
        programs_per_engine=96,
        sweep=((4, 32), (4, 64), (8, 32), (8, 64)),
        targets=(
            Target(
                "steps/min vs round_robin",
                ">= 1.5x",
                _ratio("thunder-mw", "round_robin", "steps_per_min", 1.5),
            ),
            Target(
                "steps/min vs thunderagent",
                ">= 1.0x",
                _ratio("thunder-mw", "thunderagent", "steps_per_min", 1.0),
            ),
            Target(
                "no starvation: max JCT / median",
                "<= 3",
                _metric("thunder-mw", "jct_max_over_median", 3),
            ),
        ),
    ),
    "chat-control": Scenario(
        name="chat-control",
        description="short multi-turn chats below the knee: scheduling must cost nothing",
        workload="chat",
        engines=4,
        programs_per_engine=32,
        total_factor=2.0,
        targets=(
            Target(
                "steps/min vs sticky",
                ">= 0.97x",
                _within("thunder-mw", "sticky", "steps_per_min", 0.03),
            ),
        ),
    ),
}
