"""The two headline figures of a scenario, over seeds, with their intervals and verdicts.

- `makespan_s`: the fixed batch (the scenario's concurrency of programs, all started at
  t=0, every one run to completion; nothing is cut). Lower is better; its ratio is
  baseline / thunder-mw, a speed-up.
- `steps_per_min_steady`: the long window of the closed loop (des.Arrivals: at least
  WINDOW_COMPLETIONS x the concurrency of completions inside it, calls in flight at the
  cuts counted pro rata). Higher is better; its ratio is thunder-mw / baseline.

Every summary figure and ratio carries a `ci95` (benchmarks/bootstrap.py); each ratio its
`verdict` (`win` / `tie` / `loss`). vllm_capped's cap is the best of its sweep per figure
(`choose_caps`): the best static cap in hindsight, recorded with the sweep.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from thunder_mw.benchmarks.bootstrap import compare, mean, summary
from thunder_mw.benchmarks.scenarios import CAPPED, VLLM_CAPPED, WINDOW_COMPLETIONS, Scenario

__all__ = [
    "EXTRA",
    "FIGURES",
    "NOT_BASELINES",
    "OURS",
    "capped_rows",
    "choose_caps",
    "figures",
    "format_figures",
    "is_baseline",
    "main_point",
]

OURS = "thunder-mw"
# (metric, higher is better, the runs it comes from: the fixed batch or the long window)
FIGURES = (
    ("makespan_s", False, "batch"),
    ("steps_per_min_steady", True, "window"),
    ("output_tokens_per_s_steady", True, "window"),
)
# Also summarised (no ratio): what the window held, and the batch's job completion times.
EXTRA = (
    ("steady_programs_done", "window"),
    ("steady_window_s", "window"),
    ("jct_mean_s", "batch"),
    ("jct_p95_s", "batch"),
    ("jct_max_over_median", "batch"),
    ("preemptions", "window"),
)
NOT_BASELINES = ("thunder-mw", "thunderagent")


def is_baseline(policy: str) -> bool:
    """A policy users run instead of thunder-mw (neither it, a variant of it, nor the
    original's rules)."""
    return policy not in NOT_BASELINES and not policy.startswith("thunder-mw/")


def _uncapped(scenario: Scenario, policies: list[str], capped: str = VLLM_CAPPED) -> str | None:
    """The run that is `capped` without a cap: the same engines, the same placement."""
    own = CAPPED.get(capped)
    if own is not None:
        return own if own in policies else None
    name = "vllm" if scenario.engines == 1 else "session_affinity"
    if scenario.engines == 1 and name not in policies and "offload" in policies:
        name = "offload"  # a scenario whose every engine has the tier: affinity over it
    return name if name in policies else None


def choose_caps(
    scenario: Scenario,
    policies: list[str],
    rows: list[dict[str, Any]],
    policy: str = VLLM_CAPPED,
) -> dict[str, Any] | None:
    """A capped policy's sweep (vllm_capped, offload_capped): each cap's mean over seeds of
    both figures, and per figure the cap that was best (the uncapped engine competes as the
    cap equal to the concurrency)."""
    capped = [r for r in rows if r["policy"] == policy]
    if not capped:
        return None
    main = (scenario.engines, scenario.programs_per_engine)
    uncapped = _uncapped(scenario, policies, policy)
    candidates: dict[int, dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: {"batch": [], "window": []}
    )
    for r in capped:
        candidates[r["cap"]]["batch" if r["wave"] else "window"].append(r)
    for r in rows:
        if r["policy"] == uncapped and (r["engines"], r["programs_per_engine"]) == main:
            candidates[scenario.concurrency]["batch" if r["wave"] else "window"].append(r)
    sweep: list[dict[str, Any]] = []
    for cap in sorted(candidates):
        runs = candidates[cap]
        sweep.append(
            {
                "cap": cap,
                "makespan_s": _mean([r.get("makespan_s") for r in runs["batch"]]),
                "steps_per_min_steady": _mean(
                    [r.get("steps_per_min_steady") for r in runs["window"]]
                ),
                "seeds": sorted(r["seed"] for r in runs["window"]),
            }
        )
    with_batch = [s for s in sweep if s["makespan_s"] is not None]
    with_window = [s for s in sweep if s["steps_per_min_steady"] is not None]
    return {
        "uncapped": uncapped,
        "batch_cap": min(with_batch, key=lambda s: s["makespan_s"])["cap"] if with_batch else None,
        "window_cap": max(with_window, key=lambda s: s["steps_per_min_steady"])["cap"]
        if with_window
        else None,
        "sweep": sweep,
    }


def capped_rows(
    scenario: Scenario,
    caps: dict[str, Any],
    rows: list[dict[str, Any]],
    policy: str = VLLM_CAPPED,
) -> list[dict[str, Any]]:
    """A capped policy's rows at the chosen caps (the uncapped engine's, relabelled, where no
    cap was best), each with its `cap`."""
    out = []
    main = (scenario.engines, scenario.programs_per_engine)
    for wave, cap in ((True, caps["batch_cap"]), (False, caps["window_cap"])):
        if cap is None:
            continue
        for r in rows:
            if r["wave"] != wave or (r["engines"], r["programs_per_engine"]) != main:
                continue
            if r["policy"] == policy and r["cap"] == cap:
                out.append(r)
            elif cap == scenario.concurrency and r["policy"] == caps["uncapped"]:
                out.append({**r, "policy": policy, "cap": cap})
    return out


def _mean(values: list[Any]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return round(mean(present), 2) if present else None


# One policy's runs at one point: seed -> row, for the fixed batch and the long window.
_Runs = dict[str, dict[int, dict[str, Any]]]


def figures(scenario: Scenario, policies: list[str], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per point of the scenario: each policy's figures over seeds (with ci95), thunder-mw's
    ratio over every other policy on each headline figure (paired by seed), the strongest
    baseline per figure, and whether every long window held enough completions."""
    points: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        points[(r["engines"], r["programs_per_engine"])].append(r)
    out = []
    for (engines, per), point_rows in sorted(points.items()):
        concurrency = engines * per
        by: dict[str, _Runs] = defaultdict(lambda: {"batch": {}, "window": {}})
        for r in point_rows:
            by[r["policy"]]["batch" if r["wave"] else "window"][r["seed"]] = r
        entry: dict[str, Any] = {
            "engines": engines,
            "programs_per_engine": per,
            "concurrency": concurrency,
            "min_window_completions": int(WINDOW_COMPLETIONS * concurrency),
            "policies": {},
            "ratios": {},
            "strongest": {},
        }
        window_done = []
        for policy in [p for p in policies if p in by]:
            runs = by[policy]
            window_done += [r.get("steady_programs_done") or 0 for r in runs["window"].values()]
            entry["policies"][policy] = _policy_record(runs)
        entry["window_ok"] = bool(window_done) and min(window_done) >= WINDOW_COMPLETIONS * (
            concurrency
        )
        if OURS in by:
            for policy in entry["policies"]:
                if policy != OURS:
                    entry["ratios"][policy] = _ratios(by[OURS], by[policy])
        entry["strongest"] = _strongest(entry["policies"])
        out.append(entry)
    return {"points": out}


def _policy_record(runs: _Runs) -> dict[str, Any]:
    """One policy's figures over its seeds, and its vLLM cap where it ran under one."""
    record: dict[str, Any] = {}
    for metric, _, kind in FIGURES:
        seeded = runs[kind]
        s = summary([seeded[k].get(metric) for k in sorted(seeded)])
        if s is not None:
            record[metric] = {**s, "seeds": sorted(seeded)}
    for metric, kind in EXTRA:
        seeded = runs[kind]
        s = summary([seeded[k].get(metric) for k in sorted(seeded)])
        if s is not None:
            record[metric] = s
    caps = {r.get("cap") for kind in ("batch", "window") for r in runs[kind].values()}
    if caps - {None}:
        record["cap"] = {
            kind: next(iter({r.get("cap") for r in runs[kind].values()}), None)
            for kind in ("batch", "window")
        }
    return record


def _ratios(ours: _Runs, theirs: _Runs) -> dict[str, Any]:
    """thunder-mw's ratio over another policy on each headline figure, paired by seed."""
    ratios = {}
    for metric, higher, kind in FIGURES:
        mine, other = ours[kind], theirs[kind]
        seeds = sorted(
            k
            for k in set(mine) & set(other)
            if mine[k].get(metric) is not None and other[k].get(metric)
        )
        if seeds:
            ratios[metric] = {
                **compare(
                    [mine[k][metric] for k in seeds],
                    [other[k][metric] for k in seeds],
                    higher_is_better=higher,
                ),
                "seeds": seeds,
            }
    return ratios


def _strongest(records: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The baseline with the best mean on each headline figure."""
    strongest = {}
    for metric, higher, _ in FIGURES:
        rivals = [
            (record[metric]["mean"], p)
            for p, record in records.items()
            if is_baseline(p) and metric in record
        ]
        if rivals:
            strongest[metric] = (max(rivals) if higher else min(rivals))[1]
    return strongest


def main_point(report: dict[str, Any]) -> dict[str, Any] | None:
    """The figures at the scenario's main point."""
    c = report["config"]
    for point in report.get("figures", {}).get("points", []):
        if (point["engines"], point["programs_per_engine"]) == (
            c["engines"],
            c["programs_per_engine"],
        ):
            return dict(point)
    return None


def format_figures(report: dict[str, Any]) -> str:
    """Plain-text lines: thunder-mw against the strongest baseline on each figure."""
    point = main_point(report)
    if point is None:
        return ""
    lines = []
    for metric, _, _ in FIGURES[:2]:
        rival = point["strongest"].get(metric)
        ratio = point["ratios"].get(rival, {}).get(metric) if rival else None
        ours = point["policies"].get(OURS, {}).get(metric)
        if not ratio or not ours:
            continue
        lines.append(
            f"{metric}: thunder-mw {ours['mean']} {ours['ci95']} vs strongest {rival} "
            f"{point['policies'][rival][metric]['mean']}: x{ratio['ratio']} {ratio['ci95']} "
            f"{ratio['verdict']}"
        )
    return "\n".join(lines)
