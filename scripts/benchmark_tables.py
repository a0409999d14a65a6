"""Prints the markdown results tables of benchmarks/README.md from the committed result JSON,
so the figures there are the files' figures: python scripts/benchmark_tables.py"""

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
COLUMNS = [
    ("steps_per_min", "steps/min"),
    ("output_tokens_per_s", "tok/s"),
    ("jct_mean_s", "JCT mean"),
    ("jct_p95_s", "p95"),
    ("jct_p99_s", "p99"),
    ("jct_max_over_median", "max/med"),
    ("ttft_p99_s", "TTFT p99"),
    ("ttft_max_s", "TTFT max"),
    ("prefix_hit_rate", "hit"),
    ("recomputed_prefill_tokens", "recomputed"),
    ("preemptions", "preempt"),
    ("paused_time_s", "held s"),
    ("kv_imbalance", "imbal"),
    ("resident_to_capacity_peak", "resident/cap peak"),
    ("programs_completed", "done"),
    ("programs_failed", "failed"),
]


def cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "-" if value is None else str(value)


def tables(name: str) -> str:
    report = json.loads((RESULTS / f"{name}.json").read_text())
    c = report["config"]
    lines = [
        f"### `{name}` — {c['workload']}, {c['engines']} engines x "
        f"{c['kv_tokens_per_engine']:,} KV tokens, {c['programs']} programs, seed "
        f"{report['seed']} (wall {report['wall_s']} s)",
        "",
        "| policy | " + " | ".join(label for _, label in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for r in report["results"]:
        lines.append(f"| {r['policy']} | " + " | ".join(cell(r.get(k)) for k, _ in COLUMNS) + " |")
    lines.append("")
    for t in report.get("targets", []):
        verdict = "met" if t["met"] else "**missed**"
        lines.append(f"- target {t['target']} {t['goal']}: **{t['value']}** — {verdict}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    names = sys.argv[1:] or ["swe-agent-knee", "tool-orchestra-knee", "chat-control"]
    print("\n".join(tables(n) for n in names))
