"""thunder-mw on the host-tier engines `offload` runs on, over `offload`: the same hardware.

`thunder-mw/host-tier` runs in a scenario's `<name>-variants.json`, `offload` in `<name>.json`;
both hold the same seeds' workloads and engines, so their runs pair by seed. This writes the
paired ratios (fixed batch and long window, 95 % bootstrap interval, verdict) to
results/host-tier.json, which docs/benchmarks.md's table is printed from:

    python -m thunder_mw.lab.host_tier
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from thunder_mw.benchmarks.bootstrap import compare
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result

OURS, THEIRS = "thunder-mw/host-tier", "offload"
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


def pair(main: dict[str, Any], variants: dict[str, Any]) -> dict[str, Any]:
    """Each figure's paired ratio (ours over theirs as a speed-up) on the seeds both ran."""
    out: dict[str, Any] = {}
    for metric, wave, higher in FIGURES:
        ours = per_seed(variants, OURS, wave, metric)
        theirs = per_seed(main, THEIRS, wave, metric)
        common = sorted(set(ours) & set(theirs))
        if len(common) >= 2:
            ratio = compare([ours[k] for k in common], [theirs[k] for k in common], higher)
            out[metric] = {**ratio, "seeds": common}
    return out


def main(results: Path = RESULTS_DIR) -> int:
    scenarios: dict[str, Any] = {}
    for vpath in sorted(results.glob("*-variants.json")):
        name = vpath.name.removesuffix("-variants.json")
        path = results / f"{name}.json"
        variants = json.loads(vpath.read_text())
        if not path.is_file() or OURS not in variants["config"]["policies"]:
            continue
        paired = pair(json.loads(path.read_text()), variants)
        if paired:
            scenarios[name] = paired
    write_result(
        results / "host-tier.json", {"ours": OURS, "theirs": THEIRS, "scenarios": scenarios}
    )
    print(json.dumps(scenarios, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
