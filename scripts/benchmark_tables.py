"""Prints the markdown results tables of benchmarks/README.md from the committed result JSON,
so the figures there are the files' figures: python scripts/benchmark_tables.py"""

import json
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
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


PUBLISHED = [
    "paper-swe-glm46",
    "paper-openhands-glm46",
    "paper-toolorchestra-qwen3-8b",
    "paper-rollout-2node",
    "paper-rollout-2node-openhands",
    "dynamo-minimax",
    "cluster-scaling",
    "hicache-batch192",
]
LEAD = ("thunder-mw", "thunderagent")
# Scenarios whose main point is another scenario's runs (the same fleet, workload and seeds):
# a sweep over fleet sizes, reported as that sweep, never as a second verdict.
SWEEP_OF = {"cluster-scaling": "paper-rollout-2node"}
# One JSON object of a committed result file, read as it was written.
Record = dict[str, Any]


# The revision whose files stand for "now" while a record table is made (`_as_of`): a table
# that records what a past change did reads the files of its time, not today's.
_AS_OF: str | None = None


def _as_of(revision: str, make: Callable[[], str]) -> str:
    """`make()` with the committed files read as they were at git `revision`."""
    global _AS_OF
    before, _AS_OF = _AS_OF, revision
    try:
        return make()
    finally:
        _AS_OF = before


def _report(name: str, suffix: str = "", revision: str | None = None) -> Record | None:
    """The scenario's committed `<name><suffix>.json` (`-variants`, `-drain`), if run; with
    `revision`, as it was at that git revision (a record of then)."""
    revision = revision or _AS_OF
    if revision is not None:
        import subprocess

        shown = subprocess.run(
            ["git", "show", f"{revision}:results/{name}{suffix}.json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        return json.loads(shown.stdout) if shown.returncode == 0 else None
    path = RESULTS / f"{name}{suffix}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _reports(
    names: list[str], suffix: str = "", revision: str | None = None
) -> Iterator[tuple[str, Record]]:
    """Each named scenario's committed result (`_report`), in order; scenarios without one
    are skipped."""
    for name in names:
        report = _report(name, suffix, revision)
        if report is not None:
            yield name, report


def _spread(s: Record | None) -> str:
    if not s:
        return "-"
    return f"{cell(s['median'])} ({cell(s['min'])}-{cell(s['max'])})"


def reproduction(names: list[str]) -> str:
    """One row per published figure: published ratio, simulated ratio, gap, verdict."""
    lines = [
        "| scenario | figure | published | simulated (seeds min-max) | gap | reproduced | "
        "thunder-mw over the same baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, report in _reports(names):
        for r in report.get("reproduction", []):
            measured = r["measured_ratio"]
            sim = (
                "-"
                if measured is None
                else (
                    f"{measured:.2f} ({r['measured_ratio_min']:.2f}-{r['measured_ratio_max']:.2f})"
                )
            )
            gap = "-" if r["gap"] is None else f"{r['gap']:+.0%}"
            ours = "-" if r["thunder_mw_ratio"] is None else f"{r['thunder_mw_ratio']:.2f}"
            lines.append(
                f"| `{name}` | {r['figure']} | {r['published_ratio']:.2f} | {sim} | {gap} | "
                f"{'yes' if r['reproduced'] else '**no**'} | {ours} |"
            )
    return "\n".join(lines) + "\n"


def steady(names: list[str]) -> str:
    """Steady-state steps/min per scenario at its main point: thunder-mw, the original's
    rules and the strongest other policy (median, min-max over seeds), with the wall time."""
    lines = [
        "| scenario | thunder-mw | thunderagent | strongest baseline | thunder-mw / it | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for name, report in _reports(names):
        c = report["config"]
        main = {
            r["policy"]: r
            for r in report.get("steady", [])
            if (r["engines"], r["programs_per_engine"]) == (c["engines"], c["programs_per_engine"])
        }
        others = {p: r for p, r in main.items() if p not in LEAD}
        if not others or "thunder-mw" not in main:
            continue
        best = max(others, key=lambda p: others[p]["steps_per_min_steady"]["median"])
        ours = main["thunder-mw"]["steps_per_min_steady"]
        theirs = others[best]["steps_per_min_steady"]
        ta = main.get("thunderagent", {}).get("steps_per_min_steady")
        lines.append(
            f"| `{name}` | {_spread(ours)} | {_spread(ta)} | {best} {_spread(theirs)} | "
            f"{ours['median'] / theirs['median']:.2f} | {report['wall_s']} |"
        )
    return "\n".join(lines) + "\n"


def per_size(name: str = "cluster-scaling", base: str = "kv_aware") -> str:
    """Steady steps/min per fleet size and policy, and each policy's ratio of medians over
    `base` at that size."""
    report = json.loads((RESULTS / f"{name}.json").read_text())
    rows: dict[int, dict[str, Record]] = {}
    for r in report["steady"]:
        rows.setdefault(r["engines"], {})[r["policy"]] = r["steps_per_min_steady"]
    policies = [p for p in report["config"]["policies"]]
    lines = [
        "| engines (GPUs) | "
        + " | ".join(policies)
        + " | "
        + " | ".join(f"{p} / {base}" for p in policies if p != base)
        + " |",
        "|---" * (1 + 2 * len(policies) - 1) + "|",
    ]
    for engines in sorted(rows):
        by = rows[engines]
        # vllm_capped's cap sweep runs at the main point only.
        ratios = [
            f"{by[p]['median'] / by[base]['median']:.2f}" if p in by else "-"
            for p in policies
            if p != base
        ]
        lines.append(
            f"| {engines} ({8 * engines}) | "
            + " | ".join(_spread(by.get(p)) for p in policies)
            + " | "
            + " | ".join(ratios)
            + " |"
        )
    return "\n".join(lines) + "\n"


# Baselines that know nothing of programs: issue 17's 1.15x is against the best of these.
NOT_PROGRAM_AWARE = (
    "vllm_capped",
    "kv_aware",
    "session_affinity",
    "offload",
    "continuum",
    "vllm",
    "round_robin",
    "sticky",
)


def _medians(report: Record, point: tuple[int, int]) -> dict[str, Record]:
    return {
        r["policy"]: r
        for r in report.get("steady", [])
        if (r["engines"], r["programs_per_engine"]) == point
    }


def _ratio(main: dict[str, Record], policy: str) -> float | None:
    if policy not in main or "thunder-mw" not in main:
        return None
    theirs = main[policy]["steps_per_min_steady"]["median"]
    return main["thunder-mw"]["steps_per_min_steady"]["median"] / theirs if theirs else None


def _verdict(value: float | None, goal: float, more: bool = True) -> str:
    if value is None:
        return "-"
    met = value >= goal if more else value <= goal
    return f"{value:.2f}" if met else f"**{value:.2f}**"


def targets(names: list[str]) -> str:
    """Issue 17's targets per scenario, from its main (past-the-knee) point and its smallest
    sweep point; a figure in bold misses its target. The last column: the best ablation
    variant of thunder-mw in `<name>-variants.json`, where one was run."""
    lines = [
        "| scenario | / best not program-aware (>= 1.15) | / original's rules (>= 1.1) | "
        "/ vllm_router_program (>= 1.1) | JCT mean / best other (<= 1) | max/median JCT "
        "(<= 3) | smallest sweep point: / best baseline (>= 0.98) | best variant / thunder-mw |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, report in _reports(names):
        c = report["config"]
        main = _medians(report, (c["engines"], c["programs_per_engine"]))
        if "thunder-mw" not in main:
            continue
        plain = [p for p in main if p in NOT_PROGRAM_AWARE]
        best = max(plain, key=lambda p: main[p]["steps_per_min_steady"]["median"], default=None)
        # vllm_capped's JCT starts when its cap lets a program in, not when it was offered.
        others = [p for p in main if p not in ("thunder-mw", "vllm_capped")]
        jct = main["thunder-mw"]["jct_mean_s"]["median"] / min(
            main[p]["jct_mean_s"]["median"] for p in others
        )
        spread = main["thunder-mw"]["jct_max_over_median"]["median"]
        points = sorted({(r["engines"], r["programs_per_engine"]) for r in report["steady"]})
        low = "-"
        if len(points) > 1:
            small = _medians(report, points[0])
            rivals = [p for p in small if p not in LEAD]
            top = max(rivals, key=lambda p: small[p]["steps_per_min_steady"]["median"])
            low = f"{_verdict(_ratio(small, top), 0.98)} ({top}, {points[0][1]} per engine)"
        variant = "-"
        vpath = RESULTS / f"{name}-variants.json"
        if vpath.exists():
            vmain = _medians(
                json.loads(vpath.read_text()), (c["engines"], c["programs_per_engine"])
            )
            tried = [p for p in vmain if p.startswith("thunder-mw/")]
            if tried and "thunder-mw" in vmain:
                top = max(tried, key=lambda p: vmain[p]["steps_per_min_steady"]["median"])
                variant = f"{top} {1 / _ratio(vmain, top):.2f}"  # type: ignore[operator]
        lines.append(
            f"| `{name}` | {_verdict(_ratio(main, best), 1.15) if best else '-'} ({best}) | "
            f"{_verdict(_ratio(main, 'thunderagent'), 1.1)} | "
            f"{_verdict(_ratio(main, 'vllm_router_program'), 1.1)} | "
            f"{_verdict(jct, 1.0, more=False)} | {_verdict(spread, 3.0, more=False)} | "
            f"{low} | {variant} |"
        )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ headline figures
# The two headline figures over seeds (benchmarks/figures.py): the fixed batch's makespan
# and the long window's steady steps/min, each policy's mean [ci95] and thunder-mw's ratio
# over it [ci95] with the verdict. Scenarios whose file predates them are skipped.
TUNING = [*PUBLISHED, "swe-agent-knee", "tool-orchestra-knee", "chat-control"]
TEST = ["test-mixed-fleet", "test-swe-orchestra-mix", "test-bursty-swe-glm46"]
DOCS = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
FIGURE_COLUMNS = (  # (metric, label, what thunder-mw's ratio over the policy is)
    ("makespan_s", "fixed batch: makespan s", "its makespan / thunder-mw's"),
    ("steps_per_min_steady", "long window: steps/min", "thunder-mw / it"),
)


def _main_point(report: Record) -> Record | None:
    c = report["config"]
    point: Record
    for point in report.get("figures", {}).get("points", []):
        if (point["engines"], point["programs_per_engine"]) == (
            c["engines"],
            c["programs_per_engine"],
        ):
            return point
    return None


def _ci(s: Record | None, digits: int = 1) -> str:
    if not s:
        return "-"
    low, high = s["ci95"]
    return f"{s['mean']:,.{digits}f} [{low:,.{digits}f}, {high:,.{digits}f}]"


def _ratio_cell(r: Record | None) -> str:
    if not r:
        return "-"
    low, high = r["ci95"]
    return f"{r['ratio']:.3f} [{low:.3f}, {high:.3f}] **{r['verdict']}**"


def _cap(record: Record) -> str:
    cap = record.get("cap")
    if not cap:
        return ""
    return f"cap {cap['batch']} / {cap['window']}"


def _shared_from(report: Record) -> str:
    """Where the main point's runs came from, when another scenario's file gave them."""
    shared = report.get("main_point_from")
    if not shared:
        return ""
    return (
        f" (the {report['config']['engines']}-engine runs are `{shared['scenario']}`'s, the "
        "same runs: taken from its file, this table is that file's)"
    )


def _reused_from(report: Record) -> str:
    """Which runs the wall time is of, when the file took the others from the one it
    replaced (`bench --rerun`)."""
    reused = report.get("reused") or {}
    if not reused.get("policies"):
        return ""
    rerun = [p for p in report["config"]["policies"] if p not in reused["policies"]]
    wall = reused.get("wall_s")
    then = f" (the file they came from: wall {wall} s)" if wall is not None else ""
    return f" for {', '.join(rerun) or 'nothing'}, the other policies' runs reused{then}"


def figure_table(name: str, report: Record) -> str:
    """One scenario: every policy's fixed-batch makespan and long-window steps/min (mean
    [ci95] over seeds) and thunder-mw's ratio over it [ci95] with the verdict."""
    point = _main_point(report)
    assert point is not None
    c = report["config"]
    done = point["policies"].get("thunder-mw", {}).get("steady_programs_done", {})
    lines = [
        f"#### `{name}` ({c.get('split', 'tuning')} set) — {c['description']}",
        "",
        f"{c['engines']} engines, {point['concurrency']} programs in flight, seeds "
        f"{report['seeds']}; the long window held {int(done['min']) if done else '-'}+ completions "
        f"(at least {point['min_window_completions']} asked: "
        f"{'met' if point['window_ok'] else '**not met**'}); wall {report['wall_s']} s"
        + _reused_from(report)
        + _shared_from(report)
        + ".",
        "",
        "| policy | "
        + " | ".join(f"{label} | {ratio}" for _, label, ratio in FIGURE_COLUMNS)
        + " | notes |",
        "|---" * (2 + 2 * len(FIGURE_COLUMNS)) + "|",
    ]
    for policy, record in point["policies"].items():
        ratios = point["ratios"].get(policy, {})
        cells = []
        for metric, _, _ in FIGURE_COLUMNS:
            cells.append(_ci(record.get(metric)))
            cells.append("-" if policy == "thunder-mw" else _ratio_cell(ratios.get(metric)))
        strongest = [
            m
            for m, p in point["strongest"].items()
            if p == policy and m in {c[0] for c in FIGURE_COLUMNS}
        ]
        notes = ", ".join(
            [*([_cap(record)] if _cap(record) else []), *(f"strongest on {m}" for m in strongest)]
        )
        lines.append(f"| {policy} | " + " | ".join(cells) + f" | {notes} |")
    return "\n".join(lines) + "\n"


def figure_tables(names: list[str]) -> str:
    return "\n".join(figure_table(n, r) for n, r in _reports(names) if _main_point(r))


def summary_table(names: list[str]) -> str:
    """The README's one table, a row per scenario: thunder-mw against the strongest
    baseline on the same hardware on each figure (with a host KV tier only where thunder-mw's
    own row has one), thunder-mw on the tier against the strongest tiered baseline, the
    controller's two goals on the long window (the best
    baseline that is not program-aware, >= 1.15; the vLLM router's program scheduler,
    >= 1.1) and its fixed-rules ablation. A scenario whose file predates the long window
    or the controller says so."""
    lines = [
        "| scenario | set | fixed batch: strongest on the same hardware, its makespan / "
        "thunder-mw's | long window: strongest on the same hardware, thunder-mw / it | "
        "goals: / best not program-aware (>= 1.15); "
        "/ vLLM router (>= 1.1); sweep: worst point / best at or below it (>= 0.98); "
        "max / median JCT (<= 3) | ablations: / its fixed rules; the variant it trails most "
        "| with a host KV tier: thunder-mw on it / the strongest tiered baseline, batch; window |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, report in _reports(names):
        split = report["config"].get("split", "tuning")
        link = f"[`{name}`](results/{name}.json)"
        if name in SWEEP_OF:
            lines.append(
                f"| {link} | {split} | the fleet-size sweep (2, 4, 8 engines) of "
                f"`{SWEEP_OF[name]}`, whose runs are its 2-engine point: no verdict of its own "
                "([per size](docs/benchmarks.md)) | | | | |"
            )
            continue
        point = _main_point(report)
        if point is None or not runs_default(report):
            lines.append(f"| {link} | {split} | not yet rerun with the default scheduler | | | | |")
            continue
        cells = []
        tiered = _tiered(report)
        same = {p for p in point["policies"] if (p in tiered) == ("thunder-mw" in tiered)}
        for figure, _, _ in FIGURE_COLUMNS:
            rival = _strongest_among(point, figure, same)
            record = point["policies"].get(rival, {}) if rival else {}
            cap = (
                f" (cap {record['cap']['batch' if figure == 'makespan_s' else 'window']})"
                if record.get("cap")
                else ""
            )
            ratio = _ratio_cell(point["ratios"].get(rival, {}).get(figure))
            cells.append(f"{rival}{cap} {ratio}" if rival else "-")
        first, second = _goal_cells(point, same)
        sweep = _sweep_cell(report, own_curve=False, among=same)
        sweep = "no sweep" if sweep == "-" else f"sweep {sweep}"
        goals = f"{first}; {second}; {sweep}; JCT {_starvation_cell(point)}"
        variants = _variants(name)
        ablations = (
            "no variants run"
            if variants is None
            else f"{_fixed_ratio(variants)}; {_trails_cell(variants)}"
        )
        cells += [goals, ablations, _tier_cell(name, point, tiered)]
        lines.append(f"| {link} | {split} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# The tiered thunder-mw row the README names (lab/host_tier.py TIERED): the default pipeline
# on the tiered engines, its tier rules in force.
TIER_HEADLINE = ("thunder-mw/host-tier",)
HIGHER = {"makespan_s": False, "steps_per_min_steady": True}


def _tiered(report: Record) -> set[str]:
    """The policies of a result file whose engines had the host KV tier."""
    options = report["config"].get("host_tier", {})
    return {p for p, o in options.items() if "host_kv_tokens" in o}


def _is_baseline(policy: str) -> bool:
    return policy not in ("thunder-mw", "thunderagent") and not policy.startswith("thunder-mw/")


def _strongest_among(point: Record, metric: str, among: Any) -> str | None:
    """The baseline with the best mean on `metric` among the policies `among` holds."""
    rivals: list[tuple[float, str]] = [
        (record[metric]["mean"], p)
        for p, record in point["policies"].items()
        if _is_baseline(p) and p in among and metric in record
    ]
    if not rivals:
        return None
    return (max(rivals) if HIGHER[metric] else min(rivals))[1]


def _tier_cell(name: str, point: Record, tiered: set[str]) -> str:
    """Like with like on the host tier: the tiered thunder-mw row (host-tier.json, paired by
    seed) over the strongest baseline that ran with the tier, per figure."""
    path = RESULTS / "host-tier.json"
    rows = json.loads(path.read_text())["scenarios"].get(name, {}) if path.is_file() else {}
    ours = next((r for r in TIER_HEADLINE if r in rows.get("rows", {})), None)
    if ours is None:
        return "no tiered baseline" if not tiered else "not run"
    against = rows["rows"][ours]
    caps = rows.get("caps", {})
    cells = []
    for metric in ("makespan_s", "steps_per_min_steady"):
        rival = _strongest_among(point, metric, against)
        ratio = against.get(rival, {}).get(metric) if rival else None
        if not ratio:
            cells.append("-")
            continue
        cap = f" (cap {'/'.join(map(str, caps[metric]))})" if rival == "offload_capped" else ""
        cells.append(f"{rival}{cap} {_ratio_cell(ratio)}")
    seeds = {k for by in against.values() for r in by.values() for k in r["seeds"]}
    return f"`{ours.removeprefix('thunder-mw/')}`, {len(seeds)} seeds: " + "; ".join(cells)


def _goal_cell(r: Record | None, rival: str, goal: float) -> str:
    """A ratio against its goal: met only at or above it with the interval above 1.0."""
    if not r:
        return "-"
    if r["ratio"] < goal:
        status = f"missed by {goal - r['ratio']:.2f}"
    else:
        status = "met" if r["ci95"][0] > 1.0 else "interval not above 1.0"
    return f"{r['ratio']:.2f} vs {rival}: {status}"


def _goal_cells(point: Record, among: Any = None) -> tuple[str, str]:
    """The controller's two goals on the long window: over the best baseline that is not
    program-aware (the one thunder-mw is least ahead of; of those `among` holds, where
    given: the same hardware), >= 1.15; over the vLLM router's program scheduler, >= 1.1."""
    metric = "steps_per_min_steady"
    ratios = point["ratios"]
    present = [
        p
        for p in NOT_PROGRAM_AWARE
        if metric in ratios.get(p, {}) and (among is None or p in among)
    ]
    best = min(present, key=lambda p: ratios[p][metric]["ratio"], default=None)
    first = _goal_cell(ratios[best][metric], best, 1.15) if best else "-"
    return first, _goal_cell(ratios.get("vllm_router_program", {}).get(metric), "router", 1.1)


def _variants(name: str) -> Record | None:
    """The scenario's `<name>-variants.json` (the default beside its ablations), if run."""
    return _report(name, "-variants")


def _fixed_ratio(variants: Record | None) -> str:
    """thunder-mw over its fixed-rules ablation, long window, from a variants file (ratio
    of the means over its seeds), where the file has both rows."""
    point = _main_point(variants) if variants is not None else None
    if variants is None or point is None:
        return "-"
    if not runs_default(variants):
        return "not yet rerun"
    r = point["ratios"].get("thunder-mw/fixed", {}).get("steps_per_min_steady")
    return _ratio_cell(r) if r else "-"


# Rows of a `*-variants.json` that change what runs, not a rule: `host-tier` is thunder-mw on
# offload's engines (docs/benchmarks.md's host-tier table compares it there), and
# `tier-fixed-rules`, `tier-reload` and `host-tier+tier-only-overflow` run on those engines
# too (its ablation, an opt-in and a variant of admission, compared with it and offload);
# `call-timings` prices from another source (the cost-source
# table compares it), as `min-waste` and `engine-counters` did in files written before the
# default learned from the engine's counters.
NOT_A_RULE = (
    "thunder-mw/host-tier",
    "thunder-mw/tier-fixed-rules",
    "thunder-mw/tier-reload",
    "thunder-mw/host-tier+tier-only-overflow",
    "thunder-mw/call-timings",
    "thunder-mw/min-waste",
    "thunder-mw/engine-counters",
)


def _trails_cell(variants: Record | None) -> str:
    """The rule variant the default trails most on the long window (its ratio over it, the
    lowest, where the interval says a loss), from a variants file: what the ablations show is
    left; else that none is ahead."""
    point = _main_point(variants) if variants is not None else None
    if variants is None or point is None or not runs_default(variants):
        return "-"
    metric = "steps_per_min_steady"
    ahead = [
        (r[metric]["ratio"], variant, r[metric])
        for variant, r in point["ratios"].items()
        if variant.startswith("thunder-mw/") and variant not in NOT_A_RULE and metric in r
        if r[metric]["verdict"] == "loss"
    ]
    if not ahead:
        return "no variant ahead"
    _, variant, r = min(ahead)
    return f"{variant.removeprefix('thunder-mw/')} {_ratio_cell(r)}"


def _starvation_cell(point: Record) -> str:
    """thunder-mw's max / median JCT against its bound of 3."""
    jct = point["policies"].get("thunder-mw", {}).get("jct_max_over_median")
    if not jct:
        return "-"
    tail = jct["mean"]
    return f"{tail:.2f}: " + ("met" if tail <= 3 else f"over by {tail - 3:.2f}")


# What `thunder-mw` resolves to today, as result files record it (`config.admission_overflow`;
# schemas/stage_params.py's defaults, pinned by tests/unit/test_docs.py).
# A file that names another rule, or none (written before it named it), ran an earlier default.
DEFAULT_RULES = {"admission_overflow": "adaptive"}
# The default's tier rules as the result files record them (bench_cli.resolved_rules: as
# they act), on engines with a host KV tier and without: (resume placement, idle fate,
# tier reload, pause victim: the drain's order is `fcfs` with a tier since 2026-12-05,
# recompute overflow: none without a tier since 2026-12-07). Files written before they
# were recorded ran the untiered row's first four and overflowed to recompute.
DEFAULT_TIER_RULES = {
    True: ("tier_aware", "min_waste", "off", "auto (drain fcfs)", "on"),
    False: ("home_if_room", "min_waste", "off", "auto", "off"),
}
# The default's cost source in the simulator: the engine's counters, as live (bench_cli
# `engine_counters`; the default's rows learned from call timings before 2026-12-04).
DEFAULT_ENGINE_COUNTERS = True


def runs_default(report: Record) -> bool:
    """Whether the file's `thunder-mw` ran today's default rules."""
    config = report["config"]
    rules = all(config.get(key, {}).get("thunder-mw") == v for key, v in DEFAULT_RULES.items())
    tier_rules = (
        config.get("resume_placement", {}).get("thunder-mw", "home_if_room"),
        config.get("idle_fate", {}).get("thunder-mw", "weight"),
        config.get("tier_reload", {}).get("thunder-mw", "off"),
        config.get("pause_victim", {}).get("thunder-mw"),
        config.get("recompute_overflow", {}).get("thunder-mw", "on"),
    )
    counters = bool(config.get("engine_counters", {}).get("thunder-mw", False))
    rules = rules and tier_rules == DEFAULT_TIER_RULES[_tiered_default(config)]
    rules = rules and counters == DEFAULT_ENGINE_COUNTERS
    return rules and _queue_order(config) == default_queue_order(config)


def _tiered_default(config: Record) -> bool:
    """Whether the file's `thunder-mw` ran on engines with a host KV tier."""
    return "host_kv_tokens" in config.get("host_tier", {}).get("thunder-mw", {})


def default_queue_order(config: Record) -> str:
    """The default's queue order on the file's engines (`started_first: null`): programs
    under way first where thunder-mw's engines have a host KV tier."""
    return "started_first" if _tiered_default(config) else "arrival"


def _queue_order(config: Record) -> str:
    """thunder-mw's queue order as the file records it; a file written before it did ran
    one order for paused and new programs (`arrival`) unless its pipeline said otherwise."""
    if "queue_order" in config:
        return str(config["queue_order"].get("thunder-mw"))
    migration: Record = next(
        (s["migration"] for s in config["policies"]["thunder-mw"] if "migration" in s), {}
    )
    return "started_first" if migration.get("started_first") else "arrival"


def _sweep_cell(report: Record, own_curve: bool = True, among: Any = None) -> str:
    """The sweep goal: at every point thunder-mw >= 0.98x the best steady throughput any
    policy (of those `among` holds, where given: the same hardware) reaches at that
    concurrency or below (seed medians); the worst point, its ratio and the best it is
    measured against (and, with `own_curve`, against its own best)."""
    engines = report["config"]["engines"]
    points = sorted(
        {r["programs_per_engine"] for r in report.get("steady", []) if r["engines"] == engines}
    )
    if len(points) < 2:
        return "-"
    best: tuple[float, str, int] = (0.0, "", 0)
    worst: tuple[float, int, str, int] | None = None
    own_best, own = 0.0, 1.0  # thunder-mw against its own best at lower concurrency
    for n in points:
        here = _medians(report, (engines, n))
        for policy, record in here.items():
            if among is None or policy in among or policy == "thunder-mw":
                best = max(best, (record["steps_per_min_steady"]["median"], policy, n))
        if "thunder-mw" in here and best[0]:
            figure = here["thunder-mw"]["steps_per_min_steady"]["median"]
            own_best = max(own_best, figure)
            own = min(own, figure / own_best)
            if worst is None or figure / best[0] < worst[0]:
                worst = (figure / best[0], n, best[1], best[2])
    if worst is None:
        return "-"
    ratio, n, rival, at = worst
    status = "met" if ratio >= 0.98 else f"missed by {0.98 - ratio:.2f}"
    cell = f"{ratio:.2f} at {n} vs {rival} at {at}: {status}"
    return f"{cell} (its own curve: {own:.2f})" if own_curve else cell


def controller_table(names: list[str]) -> str:
    """Per scenario, on the long window at the published concurrency: thunder-mw against
    its two targets (the best baseline that is not program-aware, >= 1.15; the vLLM
    router's program scheduler, >= 1.1; each met only with the interval above 1.0), against
    its own fixed rules (the ablation), and its starvation bound (max / median JCT <= 3).
    A scenario whose file predates the controller or the long window gets a row saying so."""
    lines = [
        "| scenario | set | / best not program-aware (>= 1.15) | / vllm_router_program (>= 1.1) "
        "| sweep: worst point / best at or below it (>= 0.98) "
        "| / thunder-mw/fixed (ablation) | the variant it trails most (ablations) "
        "| max / median JCT (<= 3) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, report in _reports(names):
        split = report["config"].get("split", "tuning")
        point = _main_point(report)
        if point is None or not runs_default(report):
            lines.append(
                f"| `{name}` | {split} | not yet rerun with the default scheduler | | | | | |"
            )
            continue
        first, second = _goal_cells(point)
        variants = _variants(name)
        lines.append(
            f"| `{name}` | {split} | {first} | {second} | {_sweep_cell(report)} "
            f"| {_fixed_ratio(variants)} | {_trails_cell(variants)} | {_starvation_cell(point)} |"
        )
    return "\n".join(lines) + "\n"


def host_tier_table(names: list[str]) -> str:
    """thunder-mw on the host-tier engines `offload` runs on (its tiered rows, in
    `<name>-variants.json`) over `offload` and over `offload_capped` at its best cap (in
    `<name>.json`), paired by seed, as the host-tier pairing command (lab/host_tier.py)
    wrote them to `host-tier.json`."""
    lines = [
        "| scenario | thunder-mw on the tier | seeds | fixed batch: offload's makespan / ours "
        "| long window: ours / offload | fixed batch: offload_capped's / ours "
        "| long window: ours / offload_capped |",
        "|---|---|---|---|---|---|---|",
    ]
    path = RESULTS / "host-tier.json"
    paired = json.loads(path.read_text())["scenarios"] if path.is_file() else {}
    for name in names:
        if name not in paired:
            continue
        caps = paired[name].get("caps", {})
        for ours, against in paired[name]["rows"].items():
            seeds = {k for by in against.values() for r in by.values() for k in r["seeds"]}
            cells = []
            for theirs in ("offload", "offload_capped"):
                for metric in ("makespan_s", "steps_per_min_steady"):
                    ratio = against.get(theirs, {}).get(metric)
                    cell = _ratio_cell(ratio) if ratio else "-"
                    if ratio and theirs == "offload_capped" and caps.get(metric):
                        cell += f" (cap {'/'.join(map(str, caps[metric]))})"
                    cells.append(cell)
            row = ours.removeprefix("thunder-mw/")
            lines.append(f"| `{name}` | {row} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


STARTED_FIRST = "thunder-mw/started-first"  # the queue order's ablations (docs/scheduling.md)
ARRIVAL_ORDER = "thunder-mw/arrival-order"
NO_ADMISSION = "thunder-mw/no-admission"  # nothing held at admission: the controller's ceiling
# The fixed rules overflowing only onto a host tier (docs/benchmarks.md), against the default
# of before it took their rule (its table is a record of the files then).
TIER_ONLY_OVERFLOW = "thunder-mw/tier-only-overflow"
# The default until 2026-12-07: KV to recompute admitted past the limit on every engine.
RECOMPUTE_OVERFLOW = "thunder-mw/recompute-overflow"
# The last commit whose result files ran that default (`recompute_overflow: true`): the
# tables that record earlier changes read their files as they were there.
RECOMPUTE_OVERFLOW_LAST = "782156f"


def variant_table(names: list[str], variant: str = "thunder-mw/cost-benefit") -> str:
    """The default pipeline over a variant of it (one rule changed), both figures, from
    `<name>-variants.json` (the scenarios where it ran), each over the file's seeds; under
    `_as_of`, the files as they were then (a record: the default of then)."""
    lines = [
        "| scenario | set | seeds | fixed batch: the variant's makespan / default's | "
        "long window: default / the variant |",
        "|---|---|---|---|---|",
    ]
    for name, report in _reports(names, "-variants"):
        point = _main_point(report)
        ratios = point["ratios"].get(variant) if point else None
        if not ratios:
            continue
        split = report["config"].get("split", "tuning")
        cells = (
            [_ratio_cell(ratios.get(m)) for m in ("makespan_s", "steps_per_min_steady")]
            if _AS_OF is not None or runs_default(report)
            else ["not yet rerun with the default", ""]
        )
        lines.append(f"| `{name}` | {split} | {len(report['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def tier_only_overflow_table(names: list[str]) -> str:
    """The default over `tier-only-overflow` as the variants files had it before the default
    took its rule (at `RECOMPUTE_OVERFLOW_LAST`: since, the two are the same runs untiered)."""
    return _as_of(RECOMPUTE_OVERFLOW_LAST, lambda: variant_table(names, TIER_ONLY_OVERFLOW))


def recompute_ceiling_table(names: list[str]) -> str:
    """What removing recompute would give (lab/recompute_ceiling.py): the router goal's
    ceiling per scenario, every row over the router on the scenario's own engines, paired by
    seed, from `recompute-ceiling.json`."""
    path = RESULTS / "recompute-ceiling.json"
    record = json.loads(path.read_text()) if path.is_file() else {"scenarios": {}}
    free = [f"{row} @free-tier" for row in record.get("free_rows", [])]
    heads = [row.removesuffix(" @free-tier").removeprefix("thunder-mw/") for row in free]
    lines = [
        "| scenario | set | seeds | thunder-mw / router, as published | on the free tier, "
        + "; ".join(heads)
        + f" / router | the ceiling / router: the goal ({record.get('goal')}x) within it? |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        entry = record["scenarios"].get(name)
        if entry is None:
            continue
        rows = entry["rows"]
        split = "test" if name in TEST else "tuning"
        cells = "; ".join(f"{rows[row]['over_router']['ratio']:.3f}" for row in free)
        ceiling = entry["ceiling"]
        within = "yes" if entry["goal_within_ceiling"] else "**no**"
        lines.append(
            f"| `{name}` | {split} | {len(entry['seeds'])} "
            f"| {_ratio_cell(entry['thunder_mw_over_router'])} | {cells} "
            f"| {ceiling['ratio']:.3f} [{ceiling['ci95'][0]:.3f}, {ceiling['ci95'][1]:.3f}]: "
            f"{within} |"
        )
    return "\n".join(lines) + "\n"


# The resume order: the vLLM router's (the most recently queued first) in thunder-mw, and
# thunder-mw's (largest first, ageing) in the router's stand-in (docs/benchmarks.md).
MRU_RESUME = "thunder-mw/mru-resume"
ROUTER = "vllm_router_program"
ROUTER_BFD_RESUME = "vllm_router_program/bfd-resume"


def router_resume_table(names: list[str]) -> str:
    """The vLLM router's stand-in over itself with thunder-mw's resume order, and the
    default over itself with the router's, both figures, paired by seed, from
    `<name>-variants.json` where both router rows ran."""
    lines = [
        "| scenario | set | seeds | router / router with thunder-mw's order: batch (makespan, "
        "inverse); window | default / default with the router's order: batch; window |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        report = _variants(name)
        if report is None or not _seed_values(report, ROUTER_BFD_RESUME, "steps_per_min_steady"):
            continue
        split = report["config"].get("split", "tuning")
        cells = [
            _paired_cell(report, ROUTER_BFD_RESUME, ROUTER, "makespan_s", wave=True),
            _paired_cell(report, ROUTER, ROUTER_BFD_RESUME, "steps_per_min_steady"),
            _paired_cell(report, MRU_RESUME, "thunder-mw", "makespan_s", wave=True),
            _paired_cell(report, "thunder-mw", MRU_RESUME, "steps_per_min_steady"),
        ]
        seeds = len(report["seeds"])
        lines.append(
            f"| `{name}` | {split} | {seeds} | {cells[0]}; {cells[1]} | {cells[2]}; {cells[3]} |"
        )
    return "\n".join(lines) + "\n"


def resume_jct_table(names: list[str], variant: str = MRU_RESUME) -> str:
    """What a resume order does to job completion times in the long window: the means over
    the file's seeds of the default's and `variant`'s median and p99 JCT and max / median,
    from `<name>-variants.json`."""
    keys = ("jct_p50_s", "jct_p99_s", "jct_max_over_median")
    digits = (0, 0, 2)  # seconds whole, the ratio to two places
    lines = [
        "| scenario | seeds | median JCT s: default -> variant | p99 JCT s | max / median |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        report = _variants(name)
        if report is None:
            continue
        ours = [_seed_values(report, "thunder-mw", k) for k in keys]
        theirs = [_seed_values(report, variant, k) for k in keys]
        seeds = sorted(set(ours[0]) & set(theirs[0]))
        if not seeds:
            continue
        cells = [
            f"{statistics.mean(a[k] for k in seeds):,.{d}f} -> "
            f"{statistics.mean(b[k] for k in seeds):,.{d}f}"
            for a, b, d in zip(ours, theirs, digits, strict=True)
        ]
        lines.append(f"| `{name}` | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# The drain's fixed order (`drain_victim: fcfs`, opt-in), run beside the default in
# `<name>-drain.json` (docs/benchmarks.md, "The drain's order").
DRAIN_FCFS = "thunder-mw/drain-fcfs"
TIER_DRAIN_FCFS = "thunder-mw/host-tier+drain-fcfs"
# The same order with programs not yet begun resumed first (`drain_victim: new_first`).
DRAIN_NEW_FIRST = "thunder-mw/drain-new-first"
TIER_DRAIN_NEW_FIRST = "thunder-mw/host-tier+drain-new-first"
NEW_FIRST_PAIR = (DRAIN_NEW_FIRST, TIER_DRAIN_NEW_FIRST)


# The router's resume order on the host tier (`thunder-mw/host-tier+mru-resume`, opt-in),
# run beside the default on the same engines in `<name>-drain.json`.
TIER_MRU_RESUME = "thunder-mw/host-tier+mru-resume"
# drain_tier_table's pair: where every engine has the tier (hicache) it is the same variant.
TIER_MRU_PAIR = (TIER_MRU_RESUME, TIER_MRU_RESUME)


def tier_variant_table(
    names: list[str], variant: str = TIER_MRU_RESUME, revision: str | None = None
) -> str:
    """A variant on the host tier over the default on the same engines, paired by seed, from
    `<name>-drain.json`: the fixed batch (makespan, inverse) with the prompt tokens it
    recomputed, the long window, and the window's max / median JCT (means over the seeds)."""
    lines = [
        "| scenario | set | seeds | fixed batch: default's makespan / the variant's; "
        "recomputed prompt tokens, variant / default | long window: the variant / default "
        "| long window's max / median JCT: default -> variant |",
        "|---|---|---|---|---|---|",
    ]
    base = "thunder-mw/host-tier"
    for name, report in _reports(names, "-drain", revision):
        if not _seed_values(report, variant, "steps_per_min_steady"):
            continue
        split = report["config"].get("split", "tuning")
        ours = _seed_values(report, variant, "recomputed_prefill_tokens", True)
        theirs = _seed_values(report, base, "recomputed_prefill_tokens", True)
        recompute = f"{sum(ours.values()) / sum(theirs.values()):.2f}x" if ours and theirs else "-"
        batch = _paired_cell(report, base, variant, "makespan_s", wave=True)
        window = _paired_cell(report, variant, base, "steps_per_min_steady")
        spread = [_seed_values(report, p, "jct_max_over_median") for p in (base, variant)]
        seeds = sorted(set(spread[0]) & set(spread[1]))
        jct = " -> ".join(f"{statistics.mean(v[k] for k in seeds):.2f}" for v in spread)
        lines.append(
            f"| `{name}` | {split} | {len(report['seeds'])} | {batch}; {recompute} | {window} "
            f"| {jct if seeds else '-'} |"
        )
    return "\n".join(lines) + "\n"


def _rival_values(report: Record, policy: str, wave: bool) -> dict[int, float]:
    """A baseline's makespan (`wave`) or steady steps/min per seed at the file's main point,
    at the cap its summary figure took (a capped baseline), else uncapped."""
    metric = "makespan_s" if wave else "steps_per_min_steady"
    point = _main_point(report)
    record = point["policies"].get(policy, {}) if point else {}
    cap = (record.get("cap") or {}).get("batch" if wave else "window")
    return {
        r["seed"]: r[metric]
        for r in report.get("sweep", [])
        if r["policy"] == policy and r["main"] and bool(r["wave"]) == wave
        if r.get("cap") == cap and r.get(metric)
    }


def drain_order_table(
    names: list[str],
    variant: str = DRAIN_FCFS,
    tier_variant: str = TIER_DRAIN_FCFS,
    revision: str | None = None,
) -> str:
    """The drain's fixed order (`variant`, on the host tier `tier_variant`) over the
    default, paired by seed, from `<name>-drain.json`:
    the fixed batch (makespan, inverse) and the long window, without and with the host KV
    tier, and the fixed batch against the strongest baseline of the README's batch column
    on the same hardware (from `<name>.json`, the seeds both ran), the default's beside the
    variant's."""
    from thunder_mw.benchmarks.bootstrap import compare

    lines = [
        "| scenario | set | seeds | fixed batch: default's makespan / the variant's; "
        "recomputed prompt tokens, variant / default | long window: the variant / default "
        "| on the host tier: batch; window | fixed batch: the strongest's makespan / the "
        "default's -> / the variant's |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, report in _reports(names, "-drain", revision):
        split = report["config"].get("split", "tuning")
        ours = _seed_values(report, variant, "recomputed_prefill_tokens", True)
        theirs = _seed_values(report, "thunder-mw", "recomputed_prefill_tokens", True)
        recompute = f"{sum(ours.values()) / sum(theirs.values()):.2f}x" if ours and theirs else "-"
        batch = _paired_cell(report, "thunder-mw", variant, "makespan_s", wave=True)
        window = _paired_cell(report, variant, "thunder-mw", "steps_per_min_steady")
        tier = "-"
        if _seed_values(report, tier_variant, "steps_per_min_steady"):
            tier_batch = _paired_cell(
                report, "thunder-mw/host-tier", tier_variant, "makespan_s", True
            )
            tier_window = _paired_cell(
                report, tier_variant, "thunder-mw/host-tier", "steps_per_min_steady"
            )
            tier = f"{tier_batch}; {tier_window}"
        rival_cell = "-"
        main_report = _report(name)
        point = _main_point(main_report) if main_report is not None else None
        if main_report is not None and point is not None:
            tiered = _tiered(main_report)
            same = {p for p in point["policies"] if (p in tiered) == ("thunder-mw" in tiered)}
            rival = _strongest_among(point, "makespan_s", same)
            if rival:
                theirs_ms = _rival_values(main_report, rival, wave=True)
                cells = []
                for policy in ("thunder-mw", variant):
                    mine = _seed_values(report, policy, "makespan_s", True)
                    seeds = sorted(set(mine) & set(theirs_ms))
                    cells.append(
                        _ratio_cell(
                            compare([theirs_ms[k] for k in seeds], [mine[k] for k in seeds])
                        )
                        if seeds
                        else "-"
                    )
                rival_cell = f"{rival}: {cells[0]} -> {cells[1]}"
        lines.append(
            f"| `{name}` | {split} | {len(report['seeds'])} | {batch}; {recompute} | {window} "
            f"| {tier} | {rival_cell} |"
        )
    return "\n".join(lines) + "\n"


# The tiered baselines the drain's order is set against (benchmarks/scenarios.py).
TIERED_RIVALS = ("offload", "offload_capped", "continuum")


def drain_tier_table(
    names: list[str],
    variant: str = DRAIN_FCFS,
    tier_variant: str = TIER_DRAIN_FCFS,
    revision: str | None = None,
) -> str:
    """thunder-mw on the host tier against each tiered baseline (from `<name>.json`, the
    capped one at its summary cap), the default's fresh rows and then the drain's order
    (`tier_variant`; `variant` where every engine of the scenario has the tier),
    paired by seed with `<name>-drain.json` (where every engine has the tier, the plain
    rows): fixed batch (the baseline's makespan / ours) and long window (ours / it)."""
    from thunder_mw.benchmarks.bootstrap import compare

    lines = [
        "| scenario | baseline | fixed batch: / the default's -> / the variant's | "
        "long window: the default / it -> the variant / it |",
        "|---|---|---|---|",
    ]
    for name, drain in _reports(names, "-drain", revision):
        main = _report(name)
        if main is None:
            continue
        if _seed_values(drain, tier_variant, "steps_per_min_steady"):
            pair = ("thunder-mw/host-tier", tier_variant)
        elif "thunder-mw" in _tiered(main):
            pair = ("thunder-mw", variant)
        else:
            continue
        for rival in TIERED_RIVALS:
            if rival not in _tiered(main):
                continue
            cells = []
            for wave in (True, False):
                theirs = _rival_values(main, rival, wave)
                metric = "makespan_s" if wave else "steps_per_min_steady"
                pairs = []
                for policy in pair:
                    mine = _seed_values(drain, policy, metric, wave)
                    seeds = sorted(set(mine) & set(theirs))
                    a, b = [theirs[k] for k in seeds], [mine[k] for k in seeds]
                    ratio = compare(a, b) if wave else compare(b, a)
                    pairs.append(_ratio_cell(ratio) if seeds else "-")
                cells.append(" -> ".join(pairs))
            lines.append(f"| `{name}` | {rival} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# The variants that price the default's rules from call timings (the simulator's cost
# source before 2026-12-04) and run the idle-fate rule of before (min-waste only where a host
# tier is); variants files written before the default changed hold the same two comparisons
# as `engine-counters` (then's default priced from the counters, i.e. today's
# `tiered-min-waste`) and `min-waste` (today's default).
CALL_TIMINGS = "thunder-mw/call-timings"
TIERED_MIN_WASTE = "thunder-mw/tiered-min-waste"
ENGINE_COUNTERS = "thunder-mw/engine-counters"
MIN_WASTE = "thunder-mw/min-waste"


def _seed_values(report: Record, policy: str, metric: str, wave: bool = False) -> dict[int, float]:
    """`policy`'s `metric` per seed at the file's main point (no cap): the long window, or
    with `wave` the fixed batch."""
    return {
        r["seed"]: r[metric]
        for r in report.get("sweep", [])
        if r["policy"] == policy and r["main"] and bool(r["wave"]) == wave
        if r.get("cap") is None and r.get(metric)
    }


def _paired_cell(report: Record, ours: str, theirs: str, metric: str, wave: bool = False) -> str:
    """`ours` over `theirs` on `metric`, paired by seed, with its interval ('-': not both);
    `wave`: in the fixed batch."""
    from thunder_mw.benchmarks.bootstrap import compare

    mine = _seed_values(report, ours, metric, wave)
    other = _seed_values(report, theirs, metric, wave)
    seeds = sorted(set(mine) & set(other))
    if not seeds:
        return "-"
    return _ratio_cell(compare([mine[k] for k in seeds], [other[k] for k in seeds]))


def cost_source_table(names: list[str]) -> str:
    """Where the prices come from, and which idle fate: the default over its rules priced
    from call timings, and over the min-waste rule only where a host tier is, long window,
    paired by seed, from `<name>-variants.json`. A file written before the default changed
    gives the second from its `min-waste` and `engine-counters` rows (the same pipelines),
    and the first as then's default, priced from call timings, over it priced from the
    counters (marked: under the idle fate of before)."""
    metric = "steps_per_min_steady"
    lines = [
        "| scenario | set | seeds | default / call timings | default / tiered min-waste |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        report = _variants(name)
        if report is None:
            continue
        split = report["config"].get("split", "tuning")
        if _seed_values(report, CALL_TIMINGS, metric):
            cells = [
                _paired_cell(report, "thunder-mw", CALL_TIMINGS, metric),
                _paired_cell(report, "thunder-mw", TIERED_MIN_WASTE, metric),
            ]
        elif _seed_values(report, ENGINE_COUNTERS, metric):
            then = _paired_cell(report, ENGINE_COUNTERS, "thunder-mw", metric)
            cells = [
                f"{then} (the idle fate of before)",
                _paired_cell(report, MIN_WASTE, ENGINE_COUNTERS, metric),
            ]
        else:
            continue
        lines.append(f"| `{name}` | {split} | {len(report['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# The last commit whose result files ran the default of before the min-waste idle fate
# everywhere and the engine's counters (docs/benchmarks.md, "Where the prices come from").
DEFAULT_BEFORE = "0db56e6"


def against_table(names: list[str], revision: str) -> str:
    """The default's rows now over the same files' at a git `revision` (the default of
    then), paired by seed: what a change of the default did, on the figures the summary
    table reads (fixed batch: then's makespan / now's; long window: now / then)."""
    from thunder_mw.benchmarks.bootstrap import compare

    lines = [
        f"| scenario | set | seeds | fixed batch: {revision}'s makespan / now | "
        f"long window: now / {revision}'s |",
        "|---|---|---|---|---|",
    ]
    for name, report in _reports(names):
        then = _report(name, revision=revision)
        if then is None:
            continue
        cells = []
        for wave, metric in ((True, "makespan_s"), (False, "steps_per_min_steady")):
            now = _seed_values(report, "thunder-mw", metric, wave)
            before = _seed_values(then, "thunder-mw", metric, wave)
            seeds = sorted(set(now) & set(before))
            if not seeds:
                cells.append("-")
                continue
            mine, theirs = [now[k] for k in seeds], [before[k] for k in seeds]
            pair = (theirs, mine) if metric == "makespan_s" else (mine, theirs)
            cells.append(_ratio_cell(compare(*pair)))
        split = report["config"].get("split", "tuning")
        lines.append(f"| `{name}` | {split} | {len(report['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# The result files as they were before a capped baseline's grid went on down below 0.25 of
# the concurrency while its best cap was the lowest run (2026-12-06).
CAP_GRID_BEFORE = "a3c948b"


def cap_grid_table(names: list[str], revision: str = CAP_GRID_BEFORE) -> str:
    """Each capped baseline whose grid went further down since git `revision`: the caps it
    ran, its best cap per figure with that figure (then -> now), and thunder-mw's ratio over
    it (then -> now; fixed batch: its makespan / thunder-mw's, long window: thunder-mw's /
    its)."""
    from thunder_mw.benchmarks.scenarios import CAPPED  # vllm_capped, offload_capped

    lines = [
        "| scenario | baseline | caps run | fixed batch: best cap, makespan s; thunder-mw's ratio "
        "| long window: best cap, steady steps/min; thunder-mw's ratio |",
        "|---|---|---|---|---|",
    ]
    for name, report in _reports(names):
        then = _report(name, revision=revision)
        if then is None:
            continue
        for policy in CAPPED:
            caps, old = report.get(policy), then.get(policy)
            if not caps or not old or len(caps["sweep"]) == len(old["sweep"]):
                continue
            ran = ", ".join(str(s["cap"]) for s in caps["sweep"])
            cells = []
            figures = (("makespan_s", "batch_cap"), ("steps_per_min_steady", "window_cap"))
            points = [(r, (_main_point(r) or {}).get("ratios", {})) for r in (then, report)]
            for metric, key in figures:
                sides = []
                for r, ratios in points:
                    cap = r[policy][key]
                    value = next(s[metric] for s in r[policy]["sweep"] if s["cap"] == cap)
                    ratio = ratios.get(policy, {}).get(metric)
                    sides.append((f"{cap}, {value:,.1f}", _ratio_cell(ratio)))
                cells.append(f"{sides[0][0]} -> {sides[1][0]}; {sides[0][1]} -> {sides[1][1]}")
            lines.append(f"| `{name}` | {policy} | {ran} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# `direct/cap`: plain vLLM behind the client cap the run chose for the regime (its best on
# the engine's calibration, `direct/cap-N`; N may differ between regimes).
REAL_SYSTEMS = {
    "direct": "plain vLLM",
    "direct/cap": "plain vLLM, its best client cap",
    "vllm-router/program": "vLLM router, program scheduler",
    "smg/consistent_hashing": "SGLang gateway, consistent hashing",
    "smg/cache_aware": "SGLang gateway, cache-aware",
    "thunderagent": "the original's rules",
    "thunder-mw/routing-only": "thunder-mw routing only (holds nothing)",
}


def real_engine_table(name: str = "vllm-cpu-real") -> str:
    """thunder-mw over each system on the real vLLM CPU engine, both regimes: the paired
    runs' ratio of means with its 95 % bootstrap interval and verdict, as the result file
    records them (`paired`)."""
    regimes = json.loads((RESULTS / f"{name}.json").read_text())["regimes"]
    order = [r for r in ("cheap", "dear") if r in regimes]
    head = " | ".join(
        f"{r} ({regimes[r]['decode_steps_per_recompute']:g} decode steps per recompute"
        # A regime whose engine did not measure what its name says (vllm_real.Regime).
        f"{', NOT as described' if regimes[r].get('as_described') is False else ''}): "
        "thunder-mw / it"
        for r in order
    )
    lines = [f"| system | {head} |", "|---|" + "---|" * len(order)]
    for system, label in REAL_SYSTEMS.items():
        pairs = [_real_pair(regimes[r]["paired"], system) for r in order]
        if not all(pairs):
            continue  # a file from before the system was run
        cells = [_interval_cell(p["steps_per_min_ratio"], cap) for p, cap in pairs if p]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    # The gateway's own cost: thunder-mw holding nothing over plain vLLM.
    own = [regimes[r]["paired"].get("thunder-mw/routing-only/direct") for r in order]
    if all(own):
        cells = [_interval_cell(p["steps_per_min_ratio"]) for p in own if p]
        lines.append("| *thunder-mw routing only / plain vLLM* | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _real_pair(paired: Record, system: str) -> tuple[Record | None, str]:
    """thunder-mw's pair with `system` in one regime, and the cap it ran at (`direct/cap`:
    whichever `direct/cap-N` the regime ran; "" for the others)."""
    if system != "direct/cap":
        return paired.get(f"thunder-mw/{system}"), ""
    prefix = f"thunder-mw/{system}-"
    key = next((k for k in paired if k.startswith(prefix)), None)
    return (paired[key], f"cap {key.removeprefix(prefix)}") if key else (None, "")


def _interval_cell(c: Record, note: str = "") -> str:
    low, high = c["ci95"]
    cell = f"{c['ratio']:.2f} [{low:.2f}, {high:.2f}] **{c['verdict']}**"
    return f"{cell} ({note})" if note else cell


def real_agreement_block(name: str = "vllm-cpu-real") -> str:
    """Per regime and system, the real runs (min / median / max of steps/min, median hit
    rate and preemptions), the simulator's figure and their ratio; then how far the two
    agree (within the tolerance; the order of the pairs the real runs tell apart)."""
    report = json.loads((RESULTS / f"{name}.json").read_text())
    lines = [
        "| regime | system | steps/min (real: min / median / max) | hit rate | preempt. "
        "| simulated | sim / real |",
        "|---|---|---|---|---|---|---|",
    ]
    for regime, doc in report["regimes"].items():
        rows = {r["policy"]: r for r in doc["agreement"]["rows"]}
        for policy, figures in doc["policies"].items():
            s, h, p = (
                figures.get(k) or {} for k in ("steps_per_min", "prefix_hit_rate", "preemptions")
            )
            steps = " / ".join(f"{s.get(k, 0):.1f}" for k in ("min", "median", "max"))
            row = rows[policy]
            lines.append(
                f"| {regime} | {policy} | {steps} | {h.get('median')} | {p.get('median')} "
                f"| {row['simulated']} | {row['ratio']} |"
            )
    lines.append("")
    for regime, doc in report["regimes"].items():
        a = doc["agreement"]
        off = [f"{r['policy']} {r['ratio']}" for r in a["rows"] if not r["within_tolerance"]]
        within = (
            f"every system within {a['tolerance']:.0%}"
            if not off
            else f"outside {a['tolerance']:.0%}: " + ", ".join(off)
        )
        pairs = a["pairs"]
        contra = "; ".join(
            f"{p['pair'][0]} / {p['pair'][1]} real {p['real_ratio']} "
            f"[{p['ci95'][0]}, {p['ci95'][1]}]"
            for p in pairs["contradicted"]
        )
        lines.append(
            f"- {regime}: {within}; of the {pairs['told_apart']} pairs of systems the real runs "
            f"tell apart, the simulator orders {pairs['ordered_alike']} alike"
            + (f" (not: {contra})" if contra else "")
            + f"; the whole order of the medians {'agrees' if a['same_ranking'] else 'differs'}."
        )
    return "\n".join(lines) + "\n"


LIVE_REGIMES = ("live-peers", "live-peers-glm46", "live-peers-minimax")


def _spread_cell(cell: Record | None, digits: int = 1) -> str:
    if not cell:
        return "-"
    lo, mid, hi = (cell[k] for k in ("min", "median", "max"))
    return f"{lo:.{digits}f} / **{mid:.{digits}f}** / {hi:.{digits}f}"


def live_peers_table(name: str) -> str:
    """One live-peers result file: per system its runs' steady steps/min (min / median /
    max), median JCT, hit rate and preemptions, the time scale the engines kept (the lowest
    of its runs), thunder-mw over it (the paired runs' ratio of means, 95 % bootstrap
    interval, verdict) and live over its DES stand-in (median of the runs' ratios)."""
    report = json.loads((RESULTS / f"{name}.json").read_text())
    agreement = {row["system"]: row for row in report["agreement"]}
    lines = [
        "| system | steady steps/min | JCT mean (s) | hit rate | preempt. | engines kept "
        "| thunder-mw / it | live / DES stand-in |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for system, summary in report["summary"].items():
        runs = [r for r in report["runs"] if r["system"] == system]
        kept = [x for r in runs for x in (r.get("engine_time_scale") or ())]
        pair = report.get("paired", {}).get(f"thunder-mw/{system}")
        ratio = (
            f"{pair['ratio']:.2f} [{pair['ci95'][0]:.2f}, {pair['ci95'][1]:.2f}] "
            f"**{pair['verdict']}**"
            if pair
            else "-"
        )
        row = agreement.get(system, {})
        live_des = (
            f"{row['median_steady_ratio']:.2f} ({row['stand_in']}"
            + ("" if row.get("agreed") else ", **outside**")
            + ")"
            if row.get("median_steady_ratio") is not None
            else "-"
        )
        hit = summary.get("prefix_hit_rate", {}).get("median")
        lines.append(
            f"| {system} | {_spread_cell(summary.get('steps_per_min_steady'))} "
            f"| {summary.get('jct_mean_s', {}).get('median', '-')} | {hit} "
            f"| {summary.get('preemptions', {}).get('median', '-')} "
            f"| {min(kept):.1f}x of {report['config']['time_scale']:g}x "
            f"| {ratio} | {live_des} |"
            if kept
            else f"| {system} | - | - | - | - | - | - | - |"
        )
    return "\n".join(lines) + "\n"


def _replace_block(path: Path, marker: str, body: str) -> None:
    text = path.read_text()
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start} ... {end} block")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{body}{end}{tail}")


# The `-drain` files as they were before the drain's order became `fcfs` on the host tier
# (2026-12-05): their tables compare the opt-in orders with the default of then, and stay a
# record of it (the files' rows since compare them with the new default).
DRAIN_RECORD = "b82a21b"


def tier_default_change_table(names: list[str], revision: str = DRAIN_RECORD) -> str:
    """The default on the host tier now (`thunder-mw/host-tier` of `<name>-drain.json`)
    over the same rows at git `revision`, paired by seed: what the drain's order by the
    tier did (fixed batch: then's makespan / now's, with the prompt tokens recomputed, now
    over then; long window: now / then)."""
    from thunder_mw.benchmarks.bootstrap import compare

    lines = [
        f"| scenario | set | seeds | fixed batch: {revision}'s makespan / now's; recomputed "
        f"prompt tokens, now / then | long window: now / {revision}'s |",
        "|---|---|---|---|---|",
    ]
    policy = "thunder-mw/host-tier"
    for name, report in _reports(names, "-drain"):
        then = _report(name, "-drain", revision)
        if then is None or not _seed_values(report, policy, "steps_per_min_steady"):
            continue
        cells = []
        for wave, metric in ((True, "makespan_s"), (False, "steps_per_min_steady")):
            now, before = (_seed_values(r, policy, metric, wave) for r in (report, then))
            seeds = sorted(set(now) & set(before))
            a, b = [before[k] for k in seeds], [now[k] for k in seeds]
            cells.append(_ratio_cell(compare(a, b) if wave else compare(b, a)) if seeds else "-")
        rec = [_seed_values(r, policy, "recomputed_prefill_tokens", True) for r in (report, then)]
        ratio = f"{sum(rec[0].values()) / sum(rec[1].values()):.2f}x" if all(rec) else "-"
        split = report["config"].get("split", "tuning")
        lines.append(
            f"| `{name}` | {split} | {len(report['seeds'])} | {cells[0]}; {ratio} | {cells[1]} |"
        )
    return "\n".join(lines) + "\n"


def _drain_record_tables() -> dict[str, Callable[[list[str]], str]]:
    """The docs' blocks read from the `-drain` files at `DRAIN_RECORD`, by block name."""
    at = DRAIN_RECORD
    return {
        "drain-order": lambda names: drain_order_table(names, revision=at),
        "drain-tier": lambda names: drain_tier_table(names, revision=at),
        "drain-new-first": lambda names: drain_order_table(names, *NEW_FIRST_PAIR, at),
        "drain-new-first-tier": lambda names: drain_tier_table(names, *NEW_FIRST_PAIR, at),
        "tier-mru-resume": lambda names: tier_variant_table(names, revision=at),
        "tier-mru-resume-rivals": lambda names: drain_tier_table(names, *TIER_MRU_PAIR, at),
    }


def update_docs() -> None:
    """Rewrites the figures blocks of docs/benchmarks.md and the README's summary table."""
    every = [*TUNING, *TEST]
    _replace_block(DOCS, "tuning-figures", figure_tables(TUNING))
    _replace_block(DOCS, "test-figures", figure_tables(TEST))
    _replace_block(DOCS, "controller-targets", controller_table(every))
    _replace_block(DOCS, "host-tier", host_tier_table(every))
    _replace_block(DOCS, "pause-victim", variant_table(every))
    _replace_block(DOCS, "started-first", variant_table(every, STARTED_FIRST))
    _replace_block(DOCS, "arrival-order", variant_table(every, ARRIVAL_ORDER))
    _replace_block(DOCS, "no-admission", variant_table(every, NO_ADMISSION))
    _replace_block(DOCS, "tier-only-overflow", tier_only_overflow_table(every))
    _replace_block(DOCS, "recompute-overflow", variant_table(every, RECOMPUTE_OVERFLOW))
    _replace_block(DOCS, "recompute-overflow-change", against_table(every, RECOMPUTE_OVERFLOW_LAST))
    _replace_block(DOCS, "mru-resume", variant_table(every, MRU_RESUME))
    for block, table in _drain_record_tables().items():
        _replace_block(DOCS, block, table(every))
    _replace_block(DOCS, "tier-default-change", tier_default_change_table(every))
    _replace_block(DOCS, "router-resume", router_resume_table(every))
    _replace_block(DOCS, "mru-resume-jct", resume_jct_table(every))
    # Records of past changes, made from the files of their time (before 2026-12-07's).
    at = RECOMPUTE_OVERFLOW_LAST
    _replace_block(DOCS, "cost-source", _as_of(at, lambda: cost_source_table(every)))
    _replace_block(DOCS, "default-change", _as_of(at, lambda: against_table(every, DEFAULT_BEFORE)))
    _replace_block(DOCS, "cap-grid", _as_of(at, lambda: cap_grid_table(every)))
    _replace_block(DOCS, "recompute-ceiling", recompute_ceiling_table(every))
    _replace_block(README, "summary-table", summary_table(every))
    _replace_block(README, "real-engine-table", real_engine_table())
    _replace_block(DOCS, "real-engine-table", real_engine_table())
    _replace_block(DOCS, "real-engine-agreement", real_agreement_block())
    _replace_block(DOCS.parent / "simulator.md", "vllm-cpu-real-agreement", real_agreement_block())


if __name__ == "__main__":
    if sys.argv[1:2] == ["--update-docs"]:
        update_docs()
        sys.exit()
    # The per-scenario tables: over the scenarios named, else every tuning and test one.
    per_scenario = {
        "--figures": figure_tables,
        "--summary": summary_table,
        "--host-tier": host_tier_table,
        "--pause-victim": variant_table,
        "--started-first": lambda names: variant_table(names, STARTED_FIRST),
        "--arrival-order": lambda names: variant_table(names, ARRIVAL_ORDER),
        "--no-admission": lambda names: variant_table(names, NO_ADMISSION),
        "--tier-only-overflow": tier_only_overflow_table,
        "--recompute-overflow": lambda names: variant_table(names, RECOMPUTE_OVERFLOW),
        "--mru-resume": lambda names: variant_table(names, MRU_RESUME),
        **{f"--{block}": table for block, table in _drain_record_tables().items()},
        "--tier-default-change": tier_default_change_table,
        "--router-resume": router_resume_table,
        "--mru-resume-jct": resume_jct_table,
        "--controller": controller_table,
        "--cost-source": cost_source_table,
        "--cap-grid": cap_grid_table,
        "--recompute-ceiling": recompute_ceiling_table,
    }
    if sys.argv[1:2] and sys.argv[1] in per_scenario:
        print(per_scenario[sys.argv[1]](sys.argv[2:] or [*TUNING, *TEST]))
        sys.exit()
    if sys.argv[1:2] == ["--live-peers"]:
        for name in sys.argv[2:] or LIVE_REGIMES:
            _replace_block(DOCS, name, live_peers_table(name))
        sys.exit()
    if sys.argv[1:2] == ["--against"]:
        # `--against REV [SCENARIO...]`: the default's rows now over the files' at REV.
        print(against_table(sys.argv[3:] or [*TUNING, *TEST], sys.argv[2]))
        sys.exit()
    if sys.argv[1:2] == ["--real-engine"]:
        print(real_engine_table())
        sys.exit()
    if sys.argv[1:2] == ["--targets"]:
        print(targets(sys.argv[2:] or PUBLISHED))
        sys.exit()
    if sys.argv[1:2] == ["--reproduction"]:
        names = sys.argv[2:] or PUBLISHED
        print(steady(names))
        print(reproduction(names))
        if "cluster-scaling" in names:
            print(per_size())
    else:
        names = sys.argv[1:] or ["swe-agent-knee", "tool-orchestra-knee", "chat-control"]
        print("\n".join(tables(n) for n in names))
