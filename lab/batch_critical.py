"""What sets a fixed batch's makespan: per seed, the program that ended last, and what its
time was made of, for each policy.

A fixed batch (every program at t=0, each run to its end) ends when its last program does.
On agent workloads that program is the one with the longest chain of tool calls, not the
one with the most engine work: a program whose tools take 600 s ends the batch whatever the
engines do, unless it is held. So a policy's makespan is mostly that program's start and
its held time, and which program it is is a draw of the workload: five seeds say little.
This runs a scenario's batch (`Scenario.wave`'s jobs, as `thunder-mw bench` does) per seed
and policy, with an optional client-side cap on any policy (`NAME@CAP`: a closed loop of at
most CAP programs, as `vllm_capped` and `offload_capped` run), and prints per run the
makespan and its last program: when its first call was sent to an engine, its tools, its
held time, the rest (the engine's time and the environment's start); then each policy's
makespans against the first policy's, paired by seed (`bootstrap.compare`: the other's
over the first's, > 1 where the first is faster). Nothing is written.

    python -m thunder_mw.lab.batch_critical --scenario swe-agent-knee \\
        --policies thunder-mw/host-tier,offload_capped@96,thunder-mw/host-tier@96 --seeds 10
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from thunder_mw.benchmarks import des
from thunder_mw.benchmarks.bench_cli import Job, job_inputs
from thunder_mw.benchmarks.bootstrap import compare
from thunder_mw.benchmarks.scenarios import POLICIES, SCENARIOS, Scenario

__all__ = ["LastProgram", "last_program", "main", "parse_policy"]

# Policies that are a cap by definition: run without one they would be another row.
_NEEDS_CAP = ("vllm_capped", "offload_capped")


@dataclass(frozen=True, slots=True)
class LastProgram:
    """The run's makespan and the program that set it."""

    makespan_s: float
    program_id: str
    first_sent_s: float  # its first call sent to an engine (its start, and any hold of it)
    tools_s: float  # the tool time of its calls (what no scheduler shortens)
    held_s: float  # time its requests were held by the gateway
    rest_s: float  # the rest: its calls in the engine, its environment's start


def parse_policy(text: str) -> tuple[str, int | None]:
    """`NAME` or `NAME@CAP`."""
    name, _, cap = text.partition("@")
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r} (benchmarks/scenarios.py POLICIES)")
    if not cap:
        if name in _NEEDS_CAP:
            raise ValueError(f"{name} runs at a cap: write {name}@CAP")
        return name, None
    if not cap.isdigit() or int(cap) < 1:
        raise ValueError(f"{text!r}: the cap after @ must be a positive integer")
    return name, int(cap)


def last_program(scenario: Scenario, policy: str, cap: int | None, seed: int) -> LastProgram:
    """One fixed batch of `scenario` under `policy` (at a client-side `cap`, if any)."""
    programs = scenario.engines * scenario.programs_per_engine
    job = Job(
        policy, scenario.engines, scenario.programs_per_engine, programs, True, seed, True, cap
    )
    sent: dict[str, float] = {}

    class _Timed(des.Simulation):
        # The first call's dispatch is the program's start (a held first call's included).
        def _dispatch(self, run: Any, label: str, kv_ttl_s: float | None = None) -> None:
            sent.setdefault(run.spec.program_id, self.now)
            super()._dispatch(run, label, kv_ttl_s)

    sim = _Timed(*job_inputs(scenario, job))
    result = sim.run()
    ended = [(r.done_at, r) for r in sim.runs.values() if r.done_at is not None]
    done_at, last = max(ended, key=lambda pair: pair[0])
    tools = sum(call.tool_s for call in last.spec.calls)
    span = done_at - last.arrived_at
    return LastProgram(
        makespan_s=round(result.metrics["makespan_s"], 1),
        program_id=last.spec.program_id,
        first_sent_s=round(sent.get(last.spec.program_id, last.arrived_at), 1),
        tools_s=round(tools, 1),
        held_s=round(last.held_s, 1),
        rest_s=round(span - tools - last.held_s, 1),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thunder_mw.lab.batch_critical")
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    parser.add_argument("--policies", required=True, help="comma-separated NAME or NAME@CAP")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args(argv)
    scenario = SCENARIOS[args.scenario]
    if not scenario.wave:
        parser.error(f"{args.scenario} has no fixed batch")
    try:
        policies = [parse_policy(p) for p in args.policies.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    seeds = range(args.seed, args.seed + args.seeds)
    makespans: dict[str, list[float]] = {}
    for name, cap in policies:
        label = f"{name}@{cap}" if cap else name
        runs = [last_program(scenario, name, cap, s) for s in seeds]
        makespans[label] = [r.makespan_s for r in runs]
        total = sum(r.makespan_s for r in runs)
        print(f"{label}: mean makespan {total / len(runs):.1f} s over seeds {list(seeds)}")
        for seed, r in zip(seeds, runs, strict=True):
            print(
                f"  seed {seed}: {r.makespan_s:7.1f} s, last {r.program_id}: first call sent "
                f"at {r.first_sent_s:.1f} s, tools {r.tools_s:.1f} s, held {r.held_s:.1f} s, "
                f"rest {r.rest_s:.1f} s"
            )
    (first, ours), *others = makespans.items()
    for label, theirs in others:
        c = compare(ours, theirs, higher_is_better=False)
        print(f"{label} / {first}: {c['ratio']} {c['ci95']} {c['verdict']} (n {c['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
