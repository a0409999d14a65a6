"""thunder-mw on the host-tier engines the tiered baselines run on, over each of them: the
same hardware.

The tiered thunder-mw rows (`TIERED`: the default pipeline on offload's engines, its tier
rules in force, their ablation, the rules before them, `tier_reload` on, and the variant
that overflows only onto the tier) run in a
scenario's `<name>-variants.json` (the default's own in `<name>-drain.json`, where it ran
there: `DEFAULT_SOURCE`); the baselines that ran with the host tier (the file's
`config.host_tier`: `offload`, `offload_capped` at the cap that was best on each figure,
Continuum where its engines have the tier) in `<name>.json`; both files hold the same seeds'
workloads and engines, so their runs pair by seed. This writes the paired ratios (fixed batch
and long window, 95 % bootstrap interval, verdict) to results/host-tier.json, which
docs/benchmarks.md's table is printed from:

    python -m thunder_mw.lab.host_tier
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from thunder_mw.benchmarks.bootstrap import compare
from thunder_mw.benchmarks.figures import is_baseline
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result

__all__ = ["FIGURES", "THEIRS", "TIERED", "caps", "main", "pair", "per_seed", "tiered_baselines"]

# The tiered thunder-mw rows, in the order the table lists them.
TIERED = (
    "thunder-mw/host-tier",
    "thunder-mw/tier-fixed-rules",
    "thunder-mw/tier-reload",
    "thunder-mw/host-tier+tier-only-overflow",  # no KV to recompute (docs/benchmarks.md)
)
# The tiered baselines `pair` takes where none is named: offload, and behind its best cap.
THEIRS = ("offload", "offload_capped")
FIGURES = (("makespan_s", True, False), ("steps_per_min_steady", False, True))


def per_seed(report: dict[str, Any], policy: str, wave: bool, metric: str) -> dict[int, float]:
    """A policy's figure per seed at the file's main point (the batch or the window run)."""
    c = report["config"]
    return {
        r["seed"]: r[metric]
        for r in report["sweep"]
        if r["policy"] == policy
        and r["main"]
        and bool(r["wave"]) == wave
        and (r["engines"], r["programs_per_engine"]) == (c["engines"], c["programs_per_engine"])
        and r.get(metric) is not None
    }


def pair(
    main: dict[str, Any],
    variants: dict[str, Any],
    ours: str = TIERED[0],
    theirs: str = THEIRS[0],
) -> dict[str, Any]:
    """Each figure's paired ratio (ours over theirs as a speed-up) on the seeds both ran."""
    out: dict[str, Any] = {}
    for metric, wave, higher in FIGURES:
        mine = per_seed(variants, ours, wave, metric)
        other = per_seed(main, theirs, wave, metric)
        common = sorted(set(mine) & set(other))
        if len(common) >= 2:
            ratio = compare([mine[k] for k in common], [other[k] for k in common], higher)
            out[metric] = {**ratio, "seeds": common}
    return out


def tiered_baselines(main: dict[str, Any]) -> list[str]:
    """The baselines of a scenario's file that ran on engines with the host tier (the
    engine options it records per policy name the tier's `host_kv_tokens`)."""
    options = main["config"].get("host_tier", {})
    return [p for p, o in options.items() if is_baseline(p) and "host_kv_tokens" in o]


def caps(main: dict[str, Any]) -> dict[str, Any]:
    """The cap `offload_capped` ran at on each figure (the best on the tuning of that file)."""
    out: dict[str, Any] = {}
    for metric, wave, _ in FIGURES:
        seen = {
            r.get("cap")
            for r in main["sweep"]
            if r["policy"] == THEIRS[1] and r["main"] and bool(r["wave"]) == wave
        }
        if seen:
            out[metric] = sorted(c for c in seen if c is not None)
    return out


# The default's tiered row is read from the scenario's `-drain` file where it ran there: those
# files are rerun with every change of the default's rules (the drain's order on the tier
# since 2026-12-05); the `-variants` files' rows are the default of when they were written.
DEFAULT_SOURCE = "-drain"


def _source(results: Path, name: str, ours: str, variants: dict[str, Any]) -> dict[str, Any]:
    """The file `ours`'s rows are read from: `<name>-drain.json` for the default's tiered
    row where that file has it, else the variants file."""
    path = results / f"{name}{DEFAULT_SOURCE}.json"
    if ours == TIERED[0] and path.is_file():
        drain: dict[str, Any] = json.loads(path.read_text())
        if ours in drain["config"]["policies"]:
            return drain
    return variants


def main(results: Path = RESULTS_DIR) -> int:
    scenarios: dict[str, Any] = {}
    for vpath in sorted(results.glob("*-variants.json")):
        name = vpath.name.removesuffix("-variants.json")
        path = results / f"{name}.json"
        variants = json.loads(vpath.read_text())
        if not path.is_file():
            continue
        report = json.loads(path.read_text())
        rows: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for ours in TIERED:
            source = _source(results, name, ours, variants)
            if ours not in source["config"]["policies"]:
                continue
            if source is not variants:
                sources[ours] = f"{name}{DEFAULT_SOURCE}.json"
            against = {
                theirs: pair(report, source, ours, theirs) for theirs in tiered_baselines(report)
            }
            against = {theirs: figures for theirs, figures in against.items() if figures}
            if against:
                rows[ours] = against
        if rows:
            scenarios[name] = {"rows": rows, "caps": caps(report), "sources": sources}
    write_result(
        results / "host-tier.json",
        {"ours": list(TIERED), "scenarios": scenarios},
    )
    print(json.dumps(scenarios, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
