"""The real CPU engine's runs replayed in the simulator with thunder-mw's pipeline swapped.

`thunder-mw bench --scenario vllm-cpu-real --resimulate` reruns the simulated half of a
committed real-engine file (each repeat's draw, its KV blocks, the profile fitted on the
engine) with the stand-ins as they are. This does the same with `thunder-mw`'s stand-in
replaced by another pipeline of benchmarks/scenarios.py (`--as POLICY`), and prints, per
regime, the default's and the variant's simulated steps/min over the repeats (the median, as
the file summarises them) and per draw, beside plain vLLM's: what a change of the default
would do on the engine's workload before the engine is run again. Nothing is written.

    python -m thunder_mw.lab.real_replay --as thunder-mw/recompute-overflow [FILE ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from thunder_mw.benchmarks import vllm_real
from thunder_mw.benchmarks.result_files import RESULTS_DIR
from thunder_mw.benchmarks.scenarios import POLICIES

__all__ = ["main", "replay"]

OURS = "thunder-mw"
PLAIN = "direct"


def _figures(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per regime: thunder-mw's and plain vLLM's simulated steps/min (median) and by draw."""
    out: dict[str, dict[str, Any]] = {}
    for regime, doc in report["regimes"].items():
        by_draw = doc.get("simulated_by_draw") or {}
        out[regime] = {
            "median": doc["simulated"][OURS]["steps_per_min"],
            "plain": doc["simulated"][PLAIN]["steps_per_min"],
            "by_draw": {d: figs[OURS]["steps_per_min"] for d, figs in by_draw.items()},
        }
    return out


def replay(report: dict[str, Any], policy: str) -> dict[str, dict[str, Any]]:
    """`report`'s regimes resimulated with the default and with `policy` as thunder-mw's
    stand-in: {"default": figures, policy: figures}."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (benchmarks/scenarios.py POLICIES)")
    default = POLICIES[OURS]
    out = {"default": _figures(vllm_real.resimulate(report))}
    try:
        POLICIES[OURS] = POLICIES[policy]
        out[policy] = _figures(vllm_real.resimulate(report))
    finally:
        POLICIES[OURS] = default
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thunder_mw.lab.real_replay")
    parser.add_argument("--as", dest="policy", required=True, help="thunder-mw's stand-in")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    for path in args.files or [RESULTS_DIR / "vllm-cpu-real.json"]:
        if not path.is_file():
            parser.error(f"{path}: no such result file")
        figures = replay(json.loads(path.read_text()), args.policy)
        for regime in figures["default"]:
            base, variant = figures["default"][regime], figures[args.policy][regime]
            draws = ", ".join(
                f"{d}: {base['by_draw'][d]} -> {variant['by_draw'][d]}" for d in base["by_draw"]
            )
            print(
                f"{path.name} {regime}: plain vLLM {base['plain']}; default {base['median']} -> "
                f"{args.policy} {variant['median']}" + (f" (by draw {draws})" if draws else "")
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
