"""mini-SWE-agent, unchanged, through thunder-mw: one run per program, its commands in a Docker
container of its own that thunder-mw adopts and reclaims; and the rollout benchmark of many.

The package is used as published (PyPI `mini-swe-agent`, the `agents` test extra): its
`DefaultAgent`, `LitellmModel` and `DockerEnvironment`, with the SWE-bench config it ships
(`config/benchmarks/swebench.yaml`: the templates of the paper's headline rows). Only the
config is ours: the model's `api_base` is the gateway, its `extra_body` names the run's
program and container (`program_id`, `docker_ids`), and the environment's `run_args` label
the container so the gateway may adopt it. The model text comes from simulated engines in
scripted agent mode (sim/scripted_agent.py); everything else — LiteLLM's client, the
agent's loop, `docker run` / `docker exec` — is real.

    thunder-mw bench --scenario mini-swe-agent [--runs 32] [--seeds 3] [--output PATH]
    python -m thunder_mw.benchmarks.mini_swe_agent --help

Writes `results/mini-swe-agent.json` (and its plot): per policy (thunder-mw, round robin)
and seed, steps per minute, job completion time, prefix-cache hit rate and the containers
reclaimed; thunder-mw over round robin as ratios with 95% intervals over the seeds.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml

from thunder_mw.benchmarks.engine_counters import delta, hit_rate
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.policies.stats import percentile

__all__ = [
    "DEFAULT_OUTPUT",
    "IMAGE",
    "MANAGED_LABEL",
    "MODEL",
    "POLICIES",
    "RUN_LABEL",
    "AgentRun",
    "End",
    "add_arguments",
    "agent_config",
    "environment_config",
    "forget_containers",
    "gateway_config",
    "leftover_containers",
    "main",
    "ratio_interval",
    "run_agent",
    "run_agents",
    "run_bench",
    "task_text",
    "write_plot",
]

DEFAULT_OUTPUT = RESULTS_DIR / "mini-swe-agent.json"
IMAGE = os.environ.get("THUNDER_MW_SANDBOX_IMAGE", "thunder-mw/sandbox:test")
MANAGED_LABEL = "thunder-mw.managed=true"
RUN_LABEL = "thunder-mw.agent-run"  # every container a run starts: leftovers are found
MODEL = "sim-model"
End = Literal["release", "final", "expire"]


@dataclass
class AgentRun:
    """One mini-SWE-agent run as it ended, with what its model calls reported."""

    program_id: str
    task: str
    end: End
    container_id: str = ""
    exit_status: str = ""
    submission: str = ""
    steps: int = 0  # model calls the agent made (its own count)
    prompt_tokens: list[int] = field(default_factory=list)  # per call, from the usage
    cached_tokens: list[int] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    error: str = ""
    # The environment stays referenced until the caller checked the reclaim: mini-SWE-agent
    # removes its container when the object is collected, which must not be what cleans up.
    env: Any = None

    @property
    def jct_s(self) -> float:
        return self.ended - self.started


def agent_config(gateway_url: str, program_id: str, container_id: str) -> dict[str, Any]:
    """mini-SWE-agent's shipped SWE-bench config, pointed at thunder-mw for this run."""
    from minisweagent.config import get_config_path

    config = yaml.safe_load(get_config_path("swebench").read_text())
    model = {
        **config["model"],
        "model_name": f"openai/{MODEL}",
        "cost_tracking": "ignore_errors",
        "model_kwargs": {
            **config["model"].get("model_kwargs", {}),
            "api_base": f"{gateway_url}/v1",
            "api_key": "unused",
            "timeout": 300,
            "extra_body": {"program_id": program_id, "docker_ids": [container_id]},
        },
    }
    agent = {**config["agent"], "step_limit": 30, "cost_limit": 0}
    return {"agent": agent, "model": model}


def environment_config(image: str = IMAGE, run_id: str = "") -> dict[str, Any]:
    """The Docker environment: the busybox sandbox (sh, not bash), labelled for adoption."""
    return {
        "image": image,
        "cwd": "/",
        "timeout": 60,
        "interpreter": ["sh", "-c"],
        # Not mini-SWE-agent's default `--rm`: the gateway stops and then removes the
        # container, and Docker's own removal on stop would race that second step.
        "run_args": [
            *("--network", "none", "--label", MANAGED_LABEL),
            *("--label", f"{RUN_LABEL}={run_id or '1'}"),
        ],
        "container_timeout": "900",
    }


def run_agent(
    gateway_url: str, program_id: str, task: str, end: End = "release", *, image: str = IMAGE
) -> AgentRun:
    """One run, blocking (mini-SWE-agent is synchronous): start the container, run the agent
    until it submits, then end the program the way `end` says."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.docker import DockerEnvironment
    from minisweagent.models.litellm_model import LitellmModel

    run = AgentRun(program_id, task, end, started=time.monotonic())
    try:
        env = DockerEnvironment(**environment_config(image, program_id))
        run.env, run.container_id = env, env.container_id or ""
        config = agent_config(gateway_url, program_id, run.container_id)
        model = LitellmModel(**config["model"])
        agent = DefaultAgent(model, env, **config["agent"])
        result = agent.run(task)
        run.exit_status = str(result.get("exit_status", ""))
        run.submission = str(result.get("submission", ""))
        run.steps = agent.n_calls
        for message in agent.messages:
            usage = (message.get("extra") or {}).get("response", {}).get("usage")
            if message.get("role") == "assistant" and usage:
                run.prompt_tokens.append(int(usage.get("prompt_tokens") or 0))
                details = usage.get("prompt_tokens_details") or {}
                run.cached_tokens.append(int(details.get("cached_tokens") or 0))
        if end == "final":
            # A closing call marked final (Dynamo's session-final header): the gateway ends
            # the program, and reclaims its container, as that call finishes.
            history = [m for m in agent.messages if m.get("role") != "exit"]
            model.query(history, extra_headers={"X-Dynamo-Session-Final": "true"})
        elif end == "release":
            httpx.post(
                f"{gateway_url}/programs/release", json={"program_id": program_id}, timeout=30
            ).raise_for_status()
    except Exception as exc:  # the run's failure is its result; the caller asserts on it
        run.error = f"{type(exc).__name__}: {exc}"
    run.ended = time.monotonic()
    return run


def forget_containers(runs: list[AgentRun]) -> None:
    """Lets go of the runs' environments once the gateway reclaimed their containers, so
    mini-SWE-agent's own clean-up (a background `docker stop` when the object is collected)
    has nothing left to do."""
    for run in runs:
        if run.env is not None:
            run.env.container_id = None
            run.env = None


def run_agents(
    gateway_url: str,
    tasks: list[tuple[str, str, End]],
    *,
    concurrency: int,
    image: str = IMAGE,
) -> list[AgentRun]:
    """Runs `(program_id, task, end)` runs, `concurrency` at a time, in threads."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    import litellm

    # LiteLLM's HTTP client for these runs is ours, so it is closed when they end (LiteLLM
    # caches the clients it makes and leaves their sockets to the garbage collector).
    previous, litellm.client_session = litellm.client_session, httpx.Client(timeout=300)
    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = [
                pool.submit(run_agent, gateway_url, p, t, e, image=image) for p, t, e in tasks
            ]
            return [f.result() for f in futures]
    finally:
        litellm.client_session.close()
        litellm.client_session = previous
        litellm.in_memory_llm_clients_cache.flush_cache()  # type: ignore[no-untyped-call]


def task_text(index: int, seed: int) -> str:
    return f"Issue {seed}-{index}: the report generator drops the last line of every file."


def leftover_containers(run_id_prefix: str = "") -> list[str]:
    """Containers any run started that still exist (the Docker CLI, as the agent uses it)."""
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={RUN_LABEL}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not run_id_prefix:
        return out
    kept = []
    for cid in out:
        label = subprocess.run(
            ["docker", "inspect", "-f", f'{{{{index .Config.Labels "{RUN_LABEL}"}}}}', cid],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if label.startswith(run_id_prefix):
            kept.append(cid)
    return kept


# ------------------------------------------------------------------------------ the benchmark
def gateway_config(policy: str, seed: int, port: int, args: argparse.Namespace) -> dict[str, Any]:
    """Two simulated engines in scripted agent mode behind `thunder-mw serve`."""
    from thunder_mw.schemas.pipeline_presets import PRESETS

    sim = {
        "flavor": "vllm",
        "num_blocks": args.num_blocks,
        "block_size": 16,
        "profile": "h100-8b",
        "time_scale": args.time_scale,
        "model_name": MODEL,
        "scripted_agent": True,
    }
    pipeline = [dict(stage) for stage in PRESETS[policy]]
    if policy == "round_robin":
        pipeline.append({"gc_hooks": {}})  # the same reclaim on expiry as thunder-mw's
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "backends": [
            {"name": f"sim-{i}", "type": "sim", "sim": {**sim, "seed": seed * 2 + i}}
            for i in range(2)
        ],
        "policies": pipeline,
        "tools": {
            "docker": {
                "enabled": True,
                "journal_path": str(Path(args.workdir) / f"journal-{policy}-{seed}.sqlite3"),
                "stop_timeout_s": 0,
            }
        },
    }


def _metric(text: str, name: str) -> dict[str, float]:
    """A Prometheus counter's samples by label set (as text), from an exposition."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            found[key[len(name) :]] = float(value)
    return found


def _one(policy: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from thunder_mw.benchmarks.live import Gateway
    from thunder_mw.sim.ports import free_port

    run_id = f"bench-{policy}-{seed}-"
    tasks: list[tuple[str, str, End]] = [
        (f"{run_id}{i}", task_text(i, seed), "release") for i in range(args.runs)
    ]
    with Gateway(gateway_config(policy, seed, free_port(), args)) as gateway:
        before = gateway.engine_totals()
        started = time.monotonic()
        runs = run_agents(gateway.url, tasks, concurrency=args.runs)
        wall = time.monotonic() - started
        engines = delta(before, gateway.engine_totals())
        profiles = httpx.get(f"{gateway.url}/profiles", timeout=10).json()["profiles"]
        deadline = time.monotonic() + 60
        while leftover_containers(run_id) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = leftover_containers(run_id)
        forget_containers(runs)
        metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    reclaimed = sum(_metric(metrics, "thunder_mw_tool_containers_reclaimed_total").values())
    held_s = sum(p["queue_s"] for p in profiles if p["program_id"].startswith(run_id))
    ok = [r for r in runs if not r.error and r.exit_status == "Submitted"]
    steps = sum(r.steps for r in runs)
    prompt = sum(sum(r.prompt_tokens) for r in runs)
    cached = sum(sum(r.cached_tokens) for r in runs)
    jcts = [r.jct_s for r in ok]
    return {
        "policy": policy,
        "seed": seed,
        "runs": len(runs),
        "submitted": len(ok),
        "errors": sorted({r.error for r in runs if r.error})[:5],
        "steps": steps,
        "wall_s": round(wall, 2),
        "steps_per_min": round(steps / wall * 60, 2),
        "jct_mean_s": round(statistics.fmean(jcts), 3) if jcts else None,
        "jct_p50_s": round(percentile(jcts, 50), 3) if jcts else None,
        "jct_p90_s": round(percentile(jcts, 90), 3) if jcts else None,
        "hit_rate": round(cached / prompt, 4) if prompt else None,
        # Where the time went: calls held at the gateway (paused or not yet admitted),
        # its pauses, and the engines' own recompute preemptions and prefix hits.
        "held_s_per_step": round(held_s / steps, 4) if steps else None,
        "pauses": int(sum(_metric(metrics, "thunder_mw_pauses_total").values())),
        "engine_preemptions": int(engines["preemptions"]),
        "engine_hit_rate": hit_rate(engines),
        "containers_started": sum(1 for r in runs if r.container_id),
        "containers_reclaimed": int(reclaimed),
        "containers_left": len(left),
    }


# Two-sided 95% Student t quantiles by degrees of freedom.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def ratio_interval(ratios: list[float]) -> dict[str, Any]:
    """Mean of per-seed ratios with its 95% t interval; `tie` where the interval holds 1.0."""
    mean = statistics.fmean(ratios)
    if len(ratios) < 2:
        return {"mean": round(mean, 4), "ci95": None, "tie": None, "per_seed": ratios}
    half = _T95.get(len(ratios) - 1, 1.96) * statistics.stdev(ratios) / len(ratios) ** 0.5
    low, high = mean - half, mean + half
    return {
        "mean": round(mean, 4),
        "ci95": [round(low, 4), round(high, 4)],
        "tie": low <= 1.0 <= high,
        "per_seed": [round(r, 4) for r in ratios],
    }


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    seeds = [args.seed + i for i in range(args.seeds)]
    # Imported before the first point is timed (LiteLLM's import takes seconds), and the
    # agent's per-step log kept out of the benchmark's output.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import minisweagent.agents.default
    import minisweagent.models.litellm_model  # noqa: F401

    logging.getLogger("minisweagent").setLevel(logging.WARNING)
    # A first point runs slower whichever policy it is (Docker and the gateway process warm
    # up): one unrecorded point of two runs first, and the order alternates by seed.
    _one(POLICIES[0], 1000, argparse.Namespace(**{**vars(args), "runs": 2}))
    results = [
        _one(policy, seed, args)
        for seed in seeds
        for policy in (POLICIES if seed % 2 == 0 else POLICIES[::-1])
    ]
    by = {(r["policy"], r["seed"]): r for r in results}
    ratios: dict[str, Any] = {}
    for name in ("steps_per_min", "jct_mean_s", "hit_rate"):
        values = [
            by[("thunder-mw", s)][name] / by[("round_robin", s)][name]
            for s in seeds
            if by[("thunder-mw", s)][name] and by[("round_robin", s)][name]
        ]
        if values:
            ratios[f"{name} thunder-mw/round_robin"] = ratio_interval(values)
    return {
        "scenario": "mini-swe-agent",
        "command": "python -m thunder_mw.benchmarks.mini_swe_agent " + shlex.join(args.argv),
        "config": {
            "agent": "mini-swe-agent (PyPI), DefaultAgent + LitellmModel + DockerEnvironment",
            "agent_version": _version("mini-swe-agent"),
            "litellm_version": _version("litellm"),
            "agent_config": "minisweagent/config/benchmarks/swebench.yaml (model and agent)",
            "engines": "2 embedded simulated vLLM engines, scripted agent mode",
            "num_blocks": args.num_blocks,
            "time_scale": args.time_scale,
            "runs_concurrent": args.runs,
            "image": IMAGE,
            "seeds": seeds,
            "policies": list(POLICIES),
        },
        "results": results,
        "ratios": ratios,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "notes": "Tool latency is the real `docker exec` of each command in the run's own "
        "container on this machine (2 shared cores); the model text is scripted, its "
        "timing the simulator's. A ratio whose ci95 holds 1.0 is a tie.",
    }


POLICIES = ("thunder-mw", "round_robin")


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def write_plot(report: dict[str, Any], path: Path) -> Path:
    """Steps/min, mean JCT and hit rate per policy (mean over seeds, with each seed's dot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("steps_per_min", "steps / min"), ("jct_mean_s", "mean JCT (s)")]
    metrics.append(("hit_rate", "prefix hit rate"))
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    for ax, (key, label) in zip(axes, metrics, strict=True):
        for x, policy in enumerate(POLICIES):
            values = [r[key] for r in report["results"] if r["policy"] == policy and r[key]]
            if values:
                ax.bar(x, statistics.fmean(values), color=("C0", "C7")[x], alpha=0.8)
                ax.plot([x] * len(values), values, "k.", markersize=4)
        ax.set_xticks(range(len(POLICIES)), POLICIES)
        ax.set_title(label, fontsize=10)
    config = report["config"]
    fig.suptitle(
        f"mini-SWE-agent, {config['runs_concurrent']} concurrent runs in Docker, two simulated "
        f"engines ({len(config['seeds'])} seeds)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=32, help="concurrent agent runs per point")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per policy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-blocks", type=int, default=1024, help="KV blocks per engine")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--workdir", default="/tmp")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="thunder-mw bench --scenario mini-swe-agent")
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    args.argv = argv
    report = run_bench(args)
    write_result(args.output, report)
    for r in report["results"]:
        print(
            f"{r['policy']:>12} seed {r['seed']}: {r['submitted']}/{r['runs']} submitted, "
            f"{r['steps_per_min']} steps/min, JCT {r['jct_mean_s']} s, hit {r['hit_rate']}, "
            f"held {r['held_s_per_step']} s/step, {r['pauses']} pauses, "
            f"{r['engine_preemptions']} preemptions, "
            f"reclaimed {r['containers_reclaimed']}/{r['containers_started']}, "
            f"left {r['containers_left']}"
        )
    for name, ratio in report["ratios"].items():
        print(f"{name}: {ratio['mean']} ci95 {ratio['ci95']}")
    if not args.no_plots:
        print(f"plot: {write_plot(report, args.output.with_suffix('.png'))}")
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
