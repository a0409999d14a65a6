"""Scenario `replicas`: two gateway replicas behind nginx over one Redis, against one gateway.

Live, on the `live-small` scenario's programs and fleet (two `thunder-mw sim-engine`
processes, fresh for every run): the same wave through

- `one_gateway`: one `thunder-mw serve` (the in-memory store);
- `two_replicas`: two `thunder-mw serve` replicas sharing a real redis-server, behind nginx
  with config/nginx-replicas.conf, programs named by header (consistent hash per program);
- `two_replicas_round_robin`: the same, programs named in the body (round robin: most steps
  land on the replica that did not run the previous one, so it takes the program over);
- `chaos`: as `two_replicas`, one replica SIGKILLed mid-wave and restarted; the client retries
  a call that failed with a connection error or a 502/503 (what nginx answers for a replica
  that died under it).

During every replica run a thread samples the sum of reservations per engine from Redis.
Then the added cost per request with Redis against the in-memory store: one gateway in front
of the proxy benchmark's fake engine, at concurrency 1.

    python -m thunder_mw.lab.replicas [--output PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from thunder_mw.benchmarks import proxy_overhead as po
from thunder_mw.benchmarks.des import ClusterConfig
from thunder_mw.benchmarks.engine_counters import read_counters
from thunder_mw.benchmarks.live import Gateway, engines_gateway_config, live_metrics
from thunder_mw.benchmarks.peers import scenario_cluster, scenario_programs, sim_engines
from thunder_mw.benchmarks.replay import Identity, Replayer, thunder_identity
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.scenarios import POLICIES, SCENARIOS
from thunder_mw.benchmarks.server_process import wait_until_healthy
from thunder_mw.benchmarks.workloads import ProgramSpec
from thunder_mw.lab.replica_stack import (
    Nginx,
    RedisServer,
    kill_replica,
    reservations,
)
from thunder_mw.policies.stats import percentile
from thunder_mw.sim.ports import free_port

__all__ = [
    "DEFAULT_OUTPUT",
    "RETRY_STATUSES",
    "SCENARIO",
    "ReservationSampler",
    "RetryingReplayer",
    "header_identity",
    "main",
    "proxy_cost",
    "run",
    "run_live",
]

SCENARIO = "replicas"
DEFAULT_OUTPUT = RESULTS_DIR / "replicas.json"
RETRY_STATUSES = frozenset({502, 503, 504, 599})


def header_identity(
    program_id: str, index: int, last: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """The program in Dynamo's session header, which nginx hashes on."""
    return {}, {"x-dynamo-session-id": program_id}


class RetryingReplayer(Replayer):
    """A client that retries a call its gateway lost (connection error, 502/503/504)."""

    retry_statuses = RETRY_STATUSES
    max_attempts = 20


class ReservationSampler:
    """Sums each engine's reservations in Redis every few milliseconds, in a thread."""

    def __init__(self, server: RedisServer, interval_s: float = 0.01) -> None:
        self.client = server.client()
        self.interval_s = interval_s
        self.max_sum: dict[str, int] = {}
        self.samples = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReservationSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for engine, programs in reservations(self.client).items():
                    total = sum(programs.values())
                    self.max_sum[engine] = max(self.max_sum.get(engine, 0), total)
                self.samples += 1
            except Exception:
                self.errors += 1
            time.sleep(self.interval_s)


def _replica_config(
    urls: list[str],
    cluster: ClusterConfig,
    pipeline: list[dict[str, Any]],
    time_scale: float,
    redis_url: str,
    port: int | None = None,
) -> dict[str, Any]:
    config = engines_gateway_config(urls, cluster, pipeline, time_scale, port or free_port())
    config["state"] = {"backend": "redis", "url": redis_url, "lease_ttl_s": 2.0}
    return config


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _replay(
    url: str, programs: list[ProgramSpec], time_scale: float, identity: Identity, chaos: Any = None
) -> tuple[Any, int]:
    replayer = RetryingReplayer(
        url, time_scale=time_scale, stream=False, identity=identity, progress=chaos
    )
    result = asyncio.run(replayer.run(programs))
    return result, replayer.retries


def run_live(
    name: str,
    programs: list[ProgramSpec],
    cluster: ClusterConfig,
    pipeline: list[dict[str, Any]],
    time_scale: float,
) -> dict[str, Any]:
    """One run of `name` (see the module's doc) on fresh engines."""
    with sim_engines(cluster, time_scale) as urls, ExitStack() as stack:
        before = read_counters(urls, timeout_s=5)
        extra: dict[str, Any] = {}
        if name == "one_gateway":
            config = engines_gateway_config(urls, cluster, pipeline, time_scale, free_port())
            gateway = stack.enter_context(Gateway(config))
            result, retries = _replay(gateway.url, programs, time_scale, thunder_identity)
        else:
            server = RedisServer().start()
            stack.callback(server.close)
            configs = [
                _replica_config(urls, cluster, pipeline, time_scale, server.url) for _ in range(2)
            ]
            replicas = [stack.enter_context(Gateway(c)) for c in configs]
            nginx = Nginx([_port(r.url) for r in replicas]).start()
            stack.callback(nginx.close)
            sampler = stack.enter_context(ReservationSampler(server))
            identity = thunder_identity if name.endswith("round_robin") else header_identity
            chaos = _Chaos(replicas[0], configs[0], len(programs)) if name == "chaos" else None
            result, retries = _replay(nginx.url, programs, time_scale, identity, chaos)
            if chaos is not None:
                stack.callback(chaos.close)
                extra["chaos"] = chaos.report()
            high = _high_watermark(pipeline)
            # The capacity the gateways plan with: what each engine reports (its blocks x
            # block size), as the gate's limit is computed.
            backends = httpx.get(f"{replicas[1].url}/health", timeout=5).json()["backends"]
            limits = {b["name"]: b["capacity_tokens"] * high for b in backends}
            extra["reservations"] = {
                "limit_per_engine": limits,
                "max_sum_per_engine": sampler.max_sum,
                "samples": sampler.samples,
                "sample_errors": sampler.errors,
                "never_exceeded": all(v <= limits[e] for e, v in sampler.max_sum.items()),
            }
        after = read_counters(urls, timeout_s=5)
    metrics = live_metrics(result, time_scale, before, after)
    return {"run": name, **metrics, "client_retries": retries, **extra}


def _high_watermark(pipeline: list[dict[str, Any]]) -> float:
    for stage in pipeline:
        if "admission" in stage:
            return float((stage["admission"] or {}).get("high_watermark", 1.0))
    return 1.0


class _Chaos:
    """Kills replica 0 once a third of the programs' calls are done, restarts it 1 s later."""

    def __init__(self, victim: Gateway, config: dict[str, Any], programs: int) -> None:
        self.victim, self.config, self.programs = victim, config, programs
        self.killed_at_calls: int | None = None
        self.restarted: Gateway | None = None
        self._thread: threading.Thread | None = None

    def __call__(self, replayer: Replayer) -> None:
        if self.killed_at_calls is None and replayer.calls_done >= 25:
            self.killed_at_calls = replayer.calls_done
            kill_replica(self.victim)
            self._thread = threading.Thread(target=self._restart, daemon=True)
            self._thread.start()

    def _restart(self) -> None:
        time.sleep(1.0)
        self.restarted = Gateway(self.config).__enter__()

    def report(self) -> dict[str, Any]:
        if self._thread is not None:
            self._thread.join()
        return {
            "killed_after_calls": self.killed_at_calls,
            "restarted": self.restarted is not None,
        }

    def close(self) -> None:
        if self.restarted is not None:
            self.restarted.__exit__(None, None, None)


# ------------------------------------------------------------------ proxy cost
@contextmanager
def _gateways_over_fake_engine(
    redis_url: str, workdir: Path
) -> Iterator[dict[str, tuple[int, int]]]:
    with ExitStack() as stack:
        log = workdir / "engine.log"
        engine = stack.enter_context(
            po._process(po._python_module("thunder_mw.benchmarks.fake_engine"), log)
        )
        engine_port = po._read_port(engine, log)
        found = {}
        for store in ("memory", "redis"):
            config = workdir / f"{store}.yaml"
            text = po._gateway_yaml(engine_port)
            if store == "redis":
                text += f"state: {{backend: redis, url: '{redis_url}'}}\n"
            config.write_text(text)
            port = free_port()
            log = workdir / f"{store}.log"
            proc = stack.enter_context(
                po._process(po._gateway_command(config, port), log, prints_port=False)
            )
            url = f"http://{po.HOST}:{port}"
            wait_until_healthy(url, timeout_s=60, process=proc, log_path=log)
            found[store] = (port, proc.pid)
        found["direct"] = (engine_port, engine.pid)
        yield found


def proxy_cost(duration_s: float, repeats: int) -> dict[str, Any]:
    """Latency p50 at concurrency 1 (non-streaming) through each store, interleaved."""
    latencies: dict[str, list[float]] = {"direct": [], "memory": [], "redis": []}
    with (
        tempfile.TemporaryDirectory(prefix="replicas-proxy-") as tmp,
        ExitStack() as stack,
    ):
        server = RedisServer().start()
        stack.callback(server.close)
        servers = stack.enter_context(_gateways_over_fake_engine(server.url, Path(tmp)))
        for repeat in range(repeats):
            for target in ("direct", "memory", "redis"):
                result = po._measure_cell(
                    *servers[target], False, 1, f"{target}-{repeat}", 0.5, duration_s
                )
                latencies[target].extend(result.latencies_s)
    p50 = {t: statistics.median(v) * 1000 for t, v in latencies.items() if v}
    p99 = {t: percentile(sorted(v), 99) * 1000 for t, v in latencies.items() if v}
    return {
        "concurrency": 1,
        "stream": False,
        "duration_s": duration_s,
        "repeats": repeats,
        "p50_ms": {t: round(v, 3) for t, v in p50.items()},
        "p99_ms": {t: round(v, 3) for t, v in p99.items()},
        "added_p50_ms_memory": round(p50["memory"] - p50["direct"], 3),
        "added_p50_ms_redis": round(p50["redis"] - p50["direct"], 3),
        "redis_minus_memory_p50_ms": round(p50["redis"] - p50["memory"], 3),
        "target_ms": 0.3,
        "met": p50["redis"] - p50["memory"] <= 0.3,
    }


# ------------------------------------------------------------------ the scenario
def run(args: argparse.Namespace) -> dict[str, Any]:
    scenario = SCENARIOS["live-small"]
    cluster = scenario_cluster(scenario, args.seed)
    programs = scenario_programs(scenario, args.seed)
    pipeline = POLICIES["thunder-mw"]
    names = [name for name in args.runs.split(",") if name]
    runs = []
    # Interleaved, so slow drift of a shared machine hits every kind of run alike; the chaos
    # run is a pass/fail check, run once.
    for repeat in range(args.repeats):
        for name in names:
            if name != "chaos" or repeat == 0:
                result = run_live(name, programs, cluster, pipeline, args.time_scale)
                runs.append({"repeat": repeat, **result})
    medians = {
        name: {
            metric: {
                "median": statistics.median(r[metric] for r in runs if r["run"] == name),
                "min": min(r[metric] for r in runs if r["run"] == name),
                "max": max(r[metric] for r in runs if r["run"] == name),
            }
            for metric in ("steps_per_min", "prefix_hit_rate", "jct_mean_s")
        }
        for name in names
    }
    one, two = medians.get("one_gateway"), medians.get("two_replicas")
    comparison: dict[str, Any] = {}
    for label, other in (("", two), ("round_robin_", medians.get("two_replicas_round_robin"))):
        if not one or not other:
            continue
        base = one["steps_per_min"]["median"]
        ratio = other["steps_per_min"]["median"] / base if base else None
        delta = other["prefix_hit_rate"]["median"] - one["prefix_hit_rate"]["median"]
        comparison |= {
            f"{label}steps_per_min_ratio": None if ratio is None else round(ratio, 3),
            f"{label}steps_per_min_met": ratio is not None and ratio >= 0.95,
            f"{label}prefix_hit_rate_delta": round(delta, 4),
            f"{label}prefix_hit_rate_met": abs(delta) <= 0.02,
        }
    comparison["targets"] = {"steps_per_min_ratio": ">= 0.95", "prefix_hit_rate_delta": "+-0.02"}
    chaos = next((r for r in runs if r["run"] == "chaos"), None)
    if chaos:
        comparison["chaos_programs_lost"] = chaos["programs_failed"]
        comparison["chaos_every_program_completed"] = chaos["programs_failed"] == 0 and chaos[
            "programs_completed"
        ] == len(programs)
    comparison["reservations_never_exceeded"] = all(
        r["reservations"]["never_exceeded"] for r in runs if "reservations" in r
    )
    report: dict[str, Any] = {
        "scenario": SCENARIO,
        "mode": "live",
        "seed": args.seed,
        "config": {
            "programs_from": scenario.name,
            "workload": scenario.workload,
            "programs": len(programs),
            "engines": cluster.engines,
            "kv_tokens_per_engine": cluster.kv_tokens,
            "time_scale": args.time_scale,
            "repeats": args.repeats,
            "compared_on": "medians over the repeats",
            "pipeline": pipeline,
            "nginx": "config/nginx-replicas.conf",
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "summary": medians,
        "comparison": comparison,
        "runs": runs,
    }
    if args.proxy_duration > 0:
        report["proxy_cost"] = proxy_cost(args.proxy_duration, args.proxy_repeats)
    write_result(Path(args.output), report)
    return report


def main(argv: list[str] | None = None) -> None:
    import json

    parser = argparse.ArgumentParser(
        prog="python -m thunder_mw.lab.replicas", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-scale", type=float, default=5.0)
    parser.add_argument("--runs", default="one_gateway,two_replicas,two_replicas_round_robin,chaos")
    parser.add_argument("--repeats", type=int, default=3, help="Runs of each kind (not chaos).")
    parser.add_argument("--proxy-duration", type=float, default=3.0)
    parser.add_argument("--proxy-repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    report = run(parser.parse_args(argv))
    summary = {"comparison": report["comparison"], "proxy": report.get("proxy_cost")}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
