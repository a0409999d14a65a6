"""One draw of the real CPU engine's committed runs, replayed in the simulator call by call:
where thunder-mw's stand-in held each program, for how long, and what the engine did.

`thunder-mw bench --scenario vllm-cpu-real --resimulate` and lab/real_replay.py give a run's
figures; this gives its timeline, for finding where a policy loses to plain vLLM on the
engine's workload (docs/benchmarks.md, "The real vLLM engine": the cheap regime's smallest
program passed over in the resume queue was found this way). Per call of each program: when
its request arrived, whether it was forwarded or held, when a held one was resumed, and the
tokens the core asked room for (its footprint); then each policy's figures on the draw.
Nothing is written.

    python -m thunder_mw.lab.real_holds --regime cheap --draw 3 [--as POLICY] [FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thunder_mw.benchmarks import vllm_real
from thunder_mw.benchmarks.des import Arrivals, Simulation
from thunder_mw.benchmarks.result_files import RESULTS_DIR
from thunder_mw.benchmarks.scenarios import POLICIES
from thunder_mw.policies.core import Action, Forward, Hold, Reject, Resumed

__all__ = ["CallRecord", "main", "timeline"]

PLAIN = vllm_real.SYSTEMS["direct"].stand_in  # plain vLLM's stand-in


@dataclass(slots=True)
class CallRecord:
    """One call's request as the core decided it."""

    program_id: str
    call: int
    sent_s: float
    decision: str  # "forward", "hold" or "reject"
    tokens: int  # the footprint the core asked room for
    resumed_s: float | None = None  # a held call: when the core resumed its program

    @property
    def held_s(self) -> float:
        if self.decision != "hold":
            return 0.0
        return (self.resumed_s if self.resumed_s is not None else self.sent_s) - self.sent_s


def timeline(
    report: dict[str, Any], regime: str, draw: int, policy: str = "thunder-mw"
) -> tuple[list[CallRecord], dict[str, Any]]:
    """Every call of the draw under `policy` (a benchmarks/scenarios.py POLICIES name), in
    the order their requests arrived, and the run's metrics."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (benchmarks/scenarios.py POLICIES)")
    if regime not in report["regimes"]:
        raise ValueError(f"no regime {regime!r} in the file: {sorted(report['regimes'])}")
    _, draws, cluster = vllm_real.replay_inputs(report, regime)
    if draw not in draws:
        raise ValueError(f"no draw {draw} in regime {regime!r}: {sorted(draws)}")
    records: list[CallRecord] = []
    waiting: dict[str, CallRecord] = {}
    sim: Simulation | None = None

    def decided(program_id: str, call: int, decision: Forward | Hold | Reject) -> None:
        assert sim is not None
        program = sim.core.snapshot(program_id)  # the core's frozen read of it
        kind = {Forward: "forward", Hold: "hold"}.get(type(decision), "reject")
        tokens = program.request_tokens if program is not None else 0
        record = CallRecord(program_id, call, round(sim.now, 4), kind, tokens)
        records.append(record)
        if kind == "hold":
            waiting[program_id] = record

    def acted(action: Action) -> None:
        assert sim is not None
        if isinstance(action, Resumed) and action.program_id in waiting:
            waiting.pop(action.program_id).resumed_s = round(sim.now, 4)

    sim = Simulation(
        draws[draw], POLICIES[policy], cluster, Arrivals("batch"), policy, acted, decided
    )
    metrics = dict(sim.run().metrics)
    return records, metrics


def _summary(metrics: dict[str, Any]) -> str:
    keys = ("steps_per_min", "makespan_s", "engine_busy", "prefix_hit_rate", "preemptions")
    return ", ".join(f"{k} {metrics.get(k)}" for k in keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thunder_mw.lab.real_holds")
    parser.add_argument("--regime", required=True, help="cheap or dear")
    parser.add_argument("--draw", type=int, required=True, help="a seed of `draw_seeds`")
    parser.add_argument("--as", dest="policy", default="thunder-mw", help="the stand-in")
    parser.add_argument("file", nargs="?", type=Path, default=RESULTS_DIR / "vllm-cpu-real.json")
    args = parser.parse_args(argv)
    if not args.file.is_file():
        parser.error(f"{args.file}: no such result file")
    report = json.loads(args.file.read_text())
    try:
        records, metrics = timeline(report, args.regime, args.draw, args.policy)
        _, plain = timeline(report, args.regime, args.draw, PLAIN)
    except ValueError as exc:
        parser.error(str(exc))
    for r in records:
        held = f", held {r.held_s:.4f} s" if r.decision == "hold" else ""
        print(
            f"{r.sent_s:9.4f}  {r.program_id} call {r.call}: {r.decision}, {r.tokens} tokens{held}"
        )
    by_program: dict[str, float] = {}
    for r in records:
        by_program[r.program_id] = by_program.get(r.program_id, 0.0) + r.held_s
    held = ", ".join(f"{p} {s:.3f} s" for p, s in sorted(by_program.items()))
    print(f"held in all: {held}")
    print(f"{args.policy}: {_summary(metrics)}")
    print(f"{PLAIN}: {_summary(plain)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
