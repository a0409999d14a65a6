"""Rerun some policies of a scenario and take every other run from the result file it
replaces (`thunder-mw bench --rerun thunder-mw`).

A scenario's file holds five seeds of every baseline at every sweep point; a change to
thunder-mw's rules changes only thunder-mw's rows. Rerunning the baselines with it costs
five times the CPU and gives, the simulation being deterministic, the same numbers. This
takes those runs from the old file, each exactly as it was recorded, where the file was
made with the same scenario, harness constants and pipeline for that policy: anything
else is an error that names what differs, never a silent mix. It cannot see a change to
the simulator's own code: the golden digest test (tests/sim/test_sim_engine_golden.py) and a
rerun of one job are what tell that the engines still behave as when the file was written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from thunder_mw.benchmarks.scenarios import CAPPED

__all__ = [
    "LEGACY_CLUSTER_DEFAULTS",
    "LEGACY_DRAIN_VICTIM",
    "LEGACY_IDLE_ENGINE",
    "LEGACY_IDLE_FATE",
    "LEGACY_PARAMS",
    "LEGACY_PAUSE_VICTIM",
    "LEGACY_QUEUE_ORDER",
    "LEGACY_RECOMPUTE_OVERFLOW",
    "LEGACY_RESUME_PLACEMENT",
    "LEGACY_TIER_RELOAD",
    "PER_POLICY",
    "RECORDED_RULES",
    "ROW_KEYS",
    "ReuseError",
    "check_config",
    "pause_rule",
    "recorded",
    "reused_output",
]

# A row's identity in a result file's `sweep` (the rest are the run's metrics).
ROW_KEYS: tuple[str, ...] = ("policy", "engines", "programs_per_engine", "concurrency")
ROW_KEYS += ("programs", "main", "seed", "wave", "cap")
# Config keys that say what a policy ran on, not which policies ran.
PER_POLICY: tuple[str, ...] = ("policies", "admission_overflow", "pause_victim", "host_tier")
PER_POLICY += ("queue_order", "description", "engine_counters", "resume_placement")
PER_POLICY += ("idle_fate", "tier_reload", "idle_engine", "recompute_overflow")
# The pause victim of `state_aware_pause: {}` until `auto` replaced it after 0.2.0; files of that
# time do not record the rule a pipeline resolved to.
LEGACY_PAUSE_VICTIM = "cost_benefit"
# `auto`'s rule once arrivals stop, before `drain_victim` could name another.
LEGACY_DRAIN_VICTIM = "cost_benefit"


def pause_rule(victim: str, drain_victim: str | None, tiered: bool = False) -> str:
    """The pause victim as a result file records it: the stage's `victim`, and for `auto`
    the drain's rule where it is not the one `auto` always had (`cost_benefit`); a null
    `drain_victim` as it acts on the run's engines (`fcfs` with a host tier)."""
    if drain_victim is None:
        drain_victim = "fcfs" if tiered else LEGACY_DRAIN_VICTIM
    if victim == "auto" and drain_victim != LEGACY_DRAIN_VICTIM:
        return f"auto (drain {drain_victim})"
    return victim


# The migration stage's order until `started_first: null` (by the host tier) became the
# default after 0.2.0: one order for paused and new programs. The baselines' presets name it
# since; files of that time name neither.
LEGACY_QUEUE_ORDER = "arrival"
# Where the migration stage resumed a paused program before `tier_aware` existed: its
# previous backend when that had room, else the most room.
LEGACY_RESUME_PLACEMENT = "home_if_room"
# What an idle program's reservation counted, and whether admission priced an overflow the
# host tier holds at its reload, before the tier rules became the default (2026-12-04).
LEGACY_IDLE_FATE = "weight"
LEGACY_TIER_RELOAD = "off"
# Whether an engine with no call in flight admitted the queue's head past the watermark,
# before that became the default (2026-12-05): it held it.
LEGACY_IDLE_ENGINE = "hold"
# Whether an engine without a host tier was filled past its limit with KV to recompute,
# before holding there became the default (2026-12-07): it was.
LEGACY_RECOMPUTE_OVERFLOW = "on"
# Params every stage of a pipeline meant before a preset had to say them (their defaults
# moved since): a preset that now names one matches its old runs that did not.
LEGACY_PARAMS: dict[str, frozenset[tuple[str, Any]]] = {
    "migration": frozenset({("started_first", False), ("tier_aware", False)}),
    "admission": frozenset(
        {("tier_reload", False), ("fill_idle_engine", False), ("recompute_overflow", True)}
    ),
    "state_aware_pause": frozenset({("idle_fate", "weight")}),
}
# Harness constants added since some files were written, at the value those files ran
# with: the simulator's scrapes carried no engine cost counters, and read vLLM's waiting
# count as the engine's queue (ClusterConfig.waiting), not the after-schedule gauge.
LEGACY_CLUSTER_DEFAULTS: dict[str, Any] = {"engine_counters": False, "waiting": "queue"}


# The rules a result file records per policy as its pipeline resolved them (bench_cli
# `resolved_rules`), a reused run's must match today's: config key -> (what it is called in
# an error, the stage that decides it, how a file written before the key existed reads it
# from that stage's params).
RECORDED_RULES: dict[str, tuple[str, str, Callable[[dict[str, Any]], str]]] = {
    "pause_victim": (
        "pause victim",
        "state_aware_pause",
        lambda params: pause_rule(
            str(params.get("victim", LEGACY_PAUSE_VICTIM)),
            str(params.get("drain_victim", LEGACY_DRAIN_VICTIM)),
        ),
    ),
    "queue_order": (
        "queue order",
        "migration",
        lambda params: "started_first" if params.get("started_first") else LEGACY_QUEUE_ORDER,
    ),
    "resume_placement": (
        "resume placement",
        "migration",
        lambda params: "tier_aware" if params.get("tier_aware") else LEGACY_RESUME_PLACEMENT,
    ),
    "idle_fate": (
        "idle fate",
        "state_aware_pause",
        lambda params: str(params.get("idle_fate", LEGACY_IDLE_FATE)),
    ),
    "tier_reload": (
        "tier reload",
        "admission",
        lambda params: "on" if params.get("tier_reload") else LEGACY_TIER_RELOAD,
    ),
    "idle_engine": (
        "idle-engine admission",
        "admission",
        lambda params: "admit" if params.get("fill_idle_engine") else LEGACY_IDLE_ENGINE,
    ),
    "recompute_overflow": (
        "recompute overflow",
        "admission",
        # Read without the engines: a tiered run that said `false` is taken as `off` (rerun).
        lambda params: (
            "off"
            if params.get("recompute_overflow") is False or params.get("overflow") == "hold"
            else LEGACY_RECOMPUTE_OVERFLOW
        ),
    ),
}


class ReuseError(ValueError):
    """The old file cannot stand in for a run (the message names what differs)."""


def check_config(old: dict[str, Any], new: dict[str, Any], reused: Iterable[str]) -> None:
    """The old file's scenario must be this one, and each reused policy must have run the
    pipeline and engines it has now."""
    new = json.loads(json.dumps(new))  # as a file holds it (tuples are lists there)
    if isinstance(old.get("cluster_defaults"), dict):
        old = {**old, "cluster_defaults": {**LEGACY_CLUSTER_DEFAULTS, **old["cluster_defaults"]}}
    differs = [k for k in new if k not in PER_POLICY and old.get(k) != new[k]]
    if differs:
        raise ReuseError(
            "the result file was made with another configuration: "
            + "; ".join(f"{k}: {old.get(k)!r} there, {new[k]!r} now" for k in differs)
        )
    for policy in reused:
        pipeline = old.get("policies", {}).get(policy)
        if pipeline is None:
            raise ReuseError(f"the result file has no runs of {policy}: rerun it too")
        if _as_written(pipeline) != _as_written(new["policies"].get(policy)):
            raise ReuseError(f"{policy}'s pipeline changed since the file was written: rerun it")
        if old.get("host_tier", {}).get(policy) != new["host_tier"].get(policy):
            raise ReuseError(f"{policy}'s engines changed since the file was written: rerun it")
        for key, (what, _, _) in RECORDED_RULES.items():
            then, now = recorded(old, policy, key), new.get(key, {}).get(policy)
            if then != now:
                raise ReuseError(
                    f"{policy}'s {what} resolved to {then} when the file was written, "
                    f"to {now} now (a default changed): rerun it"
                )
        then_counted = bool(old.get("engine_counters", {}).get(policy, False))
        if then_counted != bool(new.get("engine_counters", {}).get(policy, False)):
            learned = "the engine's counters" if then_counted else "call timings"
            raise ReuseError(
                f"{policy} learned its costs from {learned} when the file was written, "
                "not now: rerun it"
            )


def _as_written(pipeline: Any) -> Any:
    """A pipeline without the params every stage meant before a preset had to say them
    (`LEGACY_PARAMS`: `started_first: false` until the default became `null` after 0.2.0,
    the tier rules off until they became the default; the recorded rules tell the runs
    apart where a new default acts otherwise)."""
    if not isinstance(pipeline, list):
        return pipeline
    return [
        {
            name: {
                k: v
                for k, v in params.items()
                if (k, v) not in LEGACY_PARAMS.get(name, frozenset())
            }
            for name, params in stage.items()
        }
        for stage in pipeline
    ]


def recorded(config: dict[str, Any], policy: str, key: str) -> str | None:
    """The rule `key` of `RECORDED_RULES` that `policy` ran with: the file's `config[key]`,
    or for a file written before it recorded that, as its pipeline's stage said (else the
    rule of that time; None: no such stage)."""
    if key in config:
        return config[key].get(policy)  # type: ignore[no-any-return]
    _, stage_name, from_params = RECORDED_RULES[key]
    for stage in config["policies"][policy]:
        if stage_name in stage:
            return from_params(stage[stage_name])
    return None


def _matches(row: dict[str, Any], key: tuple[Any, ...]) -> bool:
    policy, engines, per_engine, seed, wave, main, cap = key
    return bool(
        row["policy"] == policy
        and row["engines"] == engines
        and row["programs_per_engine"] == per_engine
        and row["seed"] == seed
        and bool(row["wave"]) == wave
        and row.get("main", True) == main
        and (row.get("cap") or None) == cap
    )


def reused_output(old: dict[str, Any], job: Any, base_seed: int) -> dict[str, Any]:
    """What `bench_cli.run_job` returned for `job` (a bench_cli.Job, typed Any: bench_cli
    imports this module) when the old file was made: its metrics (a capped run at a cap that
    was not chosen kept only the figures the choice reads), and for the main seed's runs
    their JCT samples and time series."""
    key = (job.policy, job.engines, job.per_engine, job.seed, job.wave, job.main, job.cap)
    row = next((r for r in old["sweep"] if _matches(r, key)), None)
    if row is not None:
        metrics = {k: v for k, v in row.items() if k not in ROW_KEYS}
    elif job.policy in CAPPED:
        runs = old.get(job.policy, {}).get("runs", [])
        run = next(
            (
                r
                for r in runs
                if r["cap"] == job.cap and r["seed"] == job.seed and bool(r["wave"]) == job.wave
            ),
            None,
        )
        if run is None:
            raise ReuseError(
                f"the result file has no {job.policy} run at cap {job.cap}, seed {job.seed}: "
                "rerun it too"
            )
        metrics = {k: v for k, v in run.items() if k not in ("cap", "seed", "wave")}
    else:
        raise ReuseError(
            f"the result file has no run of {job.policy} at {job.engines}x{job.per_engine}, "
            f"seed {job.seed}{' (fixed batch)' if job.wave else ''}: rerun it too"
        )
    out: dict[str, Any] = {"metrics": metrics, "wall_s": 0.0}
    if job.main and job.seed == base_seed and not job.wave:
        name = job.policy
        if name in old.get("timeseries", {}):
            out["timeseries"] = old["timeseries"][name]
            out["jct_s"] = old["jct_s"][name]
            out["wall_s"] = old.get("run_wall_s", {}).get(name, 0.0)
    return out
