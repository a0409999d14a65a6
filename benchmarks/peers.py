"""The routers users run in front of vLLM today, started from their PyPI wheels in front of
the same simulated engines and replay as thunder-mw, so the live benchmark compares them.

Peers (the `peers` extra installs them): vLLM's router (`vllm-router`, with its program
scheduler or its cache-aware policy) and SGLang's model gateway (`smg`, cache-aware or
consistent hashing). Each system sees the program id the way its own documentation asks:

| system | program identity |
|---|---|
| thunder-mw, round_robin (`thunder-mw serve`) | body `program_id`; `/programs/release` at the end |
| vllm-router/program | body `vllm_xargs.agentic_context` {program_id, step_id, expected_resume} |
| vllm-router/cache_aware, smg/cache_aware | none (they route on the prompt's prefix) |
| smg/consistent_hashing | header `X-SMG-Routing-Key: <program id>` |

Each run gets fresh engines (`thunder-mw sim-engine` processes, so every prefix cache starts
empty) and a fresh router, all on 127.0.0.1 with free ports; the peers' Prometheus exporters
(port 29000 by default) are moved to free loopback ports too.

Regimes (LIVE_REGIMES): `live-peers` (8B engines, the peers at their defaults), and scaled-down
published setups (`live-peers-glm46`, `live-peers-minimax`) where each peer is also tuned to
the regime (PeerTuning): the vLLM router's cost models calibrated to the engines' cost profile,
and every peer's wall-clock scheduling timer divided by the time scale, so that it acts on
the engines' (simulated) clock as it would on real engines.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from thunder_mw.benchmarks.des import ClusterConfig
from thunder_mw.benchmarks.engine_counters import delta, read_counters
from thunder_mw.benchmarks.live import Gateway, engines_gateway_config, live_metrics
from thunder_mw.benchmarks.replay import Identity, Replayer, thunder_identity
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.scenarios import PUBLISHED_SCENARIOS, Scenario, kv_tokens_of
from thunder_mw.benchmarks.workloads import ProgramSpec, generate
from thunder_mw.sim.cost_model import StepCost, get_profile, prefill_positions
from thunder_mw.sim.ports import free_port

__all__ = [
    "DEFAULT_SYSTEMS",
    "INSTALL_HINT",
    "LIVE_PEERS",
    "LIVE_REGIMES",
    "MIN_POLL_S",
    "PEER_PACKAGES",
    "REGIME_SYSTEMS",
    "SMG_TIMERS",
    "SUMMARY_KEYS",
    "SYSTEMS",
    "VLLM_ROUTER_TIMERS",
    "CpuMeter",
    "DiagnosticsSampler",
    "EngineClocks",
    "LiveRegime",
    "PeerMissing",
    "PeerTuning",
    "Process",
    "Router",
    "System",
    "agreement",
    "answers_ok",
    "des_stand_in",
    "describe",
    "describe_tuning",
    "format_report",
    "missing_peers",
    "no_identity",
    "paired",
    "peer_argv",
    "peer_executable",
    "peer_versions",
    "resimulate",
    "router_cost_models",
    "router_metrics",
    "run_bench",
    "run_peers",
    "run_system",
    "scaled_down",
    "scenario_cluster",
    "scenario_programs",
    "serves_requests",
    "sim_engines",
    "simulate_stand_ins",
    "smg_key_identity",
    "smg_timer_flags",
    "start_router",
    "summarize",
    "summarize_diagnostics",
    "summarize_log",
    "vllm_router_identity",
    "vllm_router_program_config",
    "write_plot",
]

# The versions the committed results were measured with (pyproject's `peers` extra).
PEER_PACKAGES = {"vllm-router": "vllm-router==0.1.17", "smg": "smg==1.13.0"}
INSTALL_HINT = (
    "pip install 'thunder-mw[peers]'  (or: pip install " + " ".join(PEER_PACKAGES.values()) + ")"
)


class PeerMissing(RuntimeError):
    """A peer router's executable is not installed."""


def peer_executable(name: str) -> str:
    """The path of peer `name`'s executable, or PeerMissing saying how to install it."""
    found = shutil.which(name) or _beside_python(name)
    if found is None:
        raise PeerMissing(f"{name} is not installed: {INSTALL_HINT}")
    return found


def _beside_python(name: str) -> str | None:
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else None


def missing_peers() -> list[str]:
    """The peers' executables that are not installed."""
    return [
        name for name in PEER_PACKAGES if shutil.which(name) is None and not _beside_python(name)
    ]


# ------------------------------------------------------------------------------ identity
def no_identity(program_id: str, index: int, last: bool) -> tuple[dict[str, Any], dict[str, str]]:
    return {}, {}


def vllm_router_identity(
    program_id: str, index: int, last: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """vLLM router's program scheduler: `vllm_xargs.agentic_context`; `expected_resume`
    false on a program's last call is how it learns the program is over."""
    context = {"program_id": program_id, "step_id": index, "expected_resume": not last}
    return {"vllm_xargs": {"agentic_context": context}}, {}


def smg_key_identity(
    program_id: str, index: int, last: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """SGLang gateway's consistent hashing: the routing key header."""
    return {}, {"X-SMG-Routing-Key": program_id}


# ------------------------------------------------------------------------------ systems
@dataclass(frozen=True, slots=True)
class System:
    """One router configuration under test."""

    name: str
    kind: str  # "thunder-mw" (thunder-mw serve), "vllm-router" or "smg"
    stand_in: str  # the DES policy modelled on it (benchmarks/scenarios.py)
    identity: Identity = no_identity
    flags: tuple[str, ...] = ()
    pipeline: str | None = None  # kind thunder-mw: the policy preset it runs
    notes: str = ""


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("thunder-mw", "thunder-mw", "thunder-mw", thunder_identity, pipeline="thunder-mw"),
        System(
            "round_robin",
            "thunder-mw",
            "round_robin",
            thunder_identity,
            pipeline="round_robin",
            notes="thunder-mw serve with the round_robin preset: per request, the DES's own "
            "round robin (the control for live-vs-DES agreement)",
        ),
        System(
            "vllm-router/program",
            "vllm-router",
            "vllm_router_program",
            vllm_router_identity,
            ("--policy", "cache_aware", "--enable-program-scheduling"),
        ),
        System(
            "vllm-router/cache_aware", "vllm-router", "kv_aware", flags=("--policy", "cache_aware")
        ),
        System("smg/cache_aware", "smg", "kv_aware", flags=("--policy", "cache_aware")),
        System(
            "smg/consistent_hashing",
            "smg",
            "session_affinity",
            smg_key_identity,
            ("--policy", "consistent_hashing"),
        ),
    )
}
DEFAULT_SYSTEMS = tuple(SYSTEMS)


# ------------------------------------------------------------------------------ tuning
@dataclass(frozen=True, slots=True)
class PeerTuning:
    """What a peer is told about a regime besides its engines' KV capacity: the engines'
    cost profile (the vLLM router's cost models are calibrated to it, as its docs ask) and
    the time scale its wall-clock scheduling timers are divided by."""

    time_scale: float
    cost: StepCost
    chunk_tokens: int  # the engines' max_num_batched_tokens (a prefill chunk)


def router_cost_models(cost: StepCost, chunk: int, time_scale: float = 1.0) -> dict[str, Any]:
    """The vLLM router's `prefill_cost_model` and `decode_throughput_model` for engines of
    cost profile `cost` (docs/program_scheduling.md#offline-calibration-models), in the
    engines' wall seconds (simulated seconds / `time_scale`: what calibrating against the
    time-scaled engines would measure). Prefill of n tokens alone = a + b·n + e·n(n+1)/2, so
    per 1 k tokens: linear 1000·(b + e/2), quadratic 1e6·e/2. A decode step = a + c·batch +
    d·context. `decode_throughput_alpha` is the share of decode throughput kept while a
    prefill runs (the docs: low for mixed execution): one decode step over a step that also
    carries a full `chunk`-token prefill chunk (a ratio: no time scale)."""
    decode = cost.step_seconds(0, 1, 0)
    mixed = cost.step_seconds(chunk, 1, 0, prefill_positions(0, chunk))
    return {
        "prefill_cost_model": {
            "intercept_seconds": (cost.a + cost.f) / time_scale,
            "linear_seconds_per_1k_tokens": 1000 * (cost.b + cost.e / 2) / time_scale,
            "quadratic_seconds_per_1k_tokens_squared": 1e6 * cost.e / 2 / time_scale,
            "decode_throughput_alpha": round(decode / mixed, 4),
        },
        "decode_throughput_model": {
            "fixed_step_seconds": cost.a / time_scale,
            "batch_step_seconds_per_request": cost.c / time_scale,
            "context_step_seconds_per_token": cost.d / time_scale,
        },
    }


# The vLLM router's program-scheduling timers at their documented defaults (seconds,
# docs/program_scheduling.md, configuration reference): its metrics poll, the acting TTL's
# cap, a retained request's limit, the force-resume bound, paused-program retention and the
# shared-prefix observation lifetime before its statistics mature.
VLLM_ROUTER_TIMERS = {
    "metrics_interval_seconds": 1.0,
    "max_acting_ttl_seconds": 10.0,
    "queue_timeout_seconds": 600.0,
    "force_resume_timeout_seconds": 300.0,
    "paused_retention_ttl_seconds": 1800.0,
    "shared_prefix_freshness_warmup_seconds": 100.0,
}
# smg 1.13's scheduling timers at their defaults (`smg launch --help`; whole seconds): the
# cache-aware warm-up slice, how long a cache-affinity placement stays routable, the prefix
# tree's eviction, the worker-load poll (overload protection reads it) and a sticky key's
# idle life. Fault-detection timers (stall, wedge, health checks) are left as they are.
MIN_POLL_S = 0.1  # the shortest wall-clock engine poll a peer is given (vllm_router_program_config)
SMG_TIMERS = {
    "--worker-warmup-secs": 60,
    "--cache-ttl-secs": 180,
    "--eviction-interval-secs": 60,
    "--load-monitor-interval": 10,
    "--max-idle-secs": 14_400,
}


def smg_timer_flags(time_scale: float) -> list[str]:
    """SMG_TIMERS divided by the time scale, rounded to whole seconds, at least 1 (smg takes
    integers): where the division falls below 1 s the timer stays slower than on real
    engines (the load poll: 1 s wall = `time_scale` simulated seconds, not 10)."""
    flags: list[str] = []
    for flag, seconds in SMG_TIMERS.items():
        flags += [flag, str(max(1, math.floor(seconds / time_scale + 0.5)))]
    return flags


def vllm_router_program_config(kv_tokens: int, tuning: PeerTuning | None) -> dict[str, Any]:
    """The program scheduler's config: the engines' KV capacity (without it the scheduler
    runs on its own ledger); with `tuning`, also the recommended `global_queue: true`, the
    cost models calibrated to the engines and its timers divided by the time scale."""
    config: dict[str, Any] = {"token_capacity_per_dp_rank": kv_tokens}
    if tuning is None:
        return config
    config["global_queue"] = True
    for key, seconds in VLLM_ROUTER_TIMERS.items():
        config[key] = seconds / tuning.time_scale
    # Each poll renders a simulated engine's /metrics on the event loop that runs its steps;
    # at 1/time_scale (40 renders a second per engine at 40x) that is CPU the engines lack
    # on a shared machine, so the poll is held near thunder-mw's own (5/time_scale s).
    config["metrics_interval_seconds"] = max(config["metrics_interval_seconds"], MIN_POLL_S)
    return config | router_cost_models(tuning.cost, tuning.chunk_tokens, tuning.time_scale)


def peer_argv(
    system: System,
    urls: list[str],
    port: int,
    metrics_port: int,
    kv_tokens: int,
    tuning: PeerTuning | None = None,
) -> list[str]:
    """The command line that starts `system` (a peer) in front of engines at `urls`;
    `tuning`: calibrated to the regime (else: every default but the KV capacity)."""
    loopback = ["--host", "127.0.0.1", "--port", str(port)]
    metrics = ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
    if system.kind == "vllm-router":
        argv = [peer_executable("vllm-router"), *loopback, "--worker-urls", *urls, *metrics]
        argv += ["--log-level", "info", *system.flags]
        if "--enable-program-scheduling" in system.flags:
            config = vllm_router_program_config(kv_tokens, tuning)
            argv += ["--program-scheduling-config-json", json.dumps(config)]
        return argv
    if system.kind == "smg":
        argv = [peer_executable("smg"), "launch", *loopback, "--worker-urls", *urls, *metrics]
        # No 10 s drain when the benchmark stops it (nothing is in flight by then).
        argv += ["--log-level", "info", "--shutdown-grace-period-secs", "0", *system.flags]
        return argv + (smg_timer_flags(tuning.time_scale) if tuning is not None else [])
    raise ValueError(f"{system.name} is not a peer")


# ------------------------------------------------------------------------------ processes
class Process:
    """A child process with its log in a temporary folder, stopped on exit."""

    def __init__(self, argv: list[str], name: str) -> None:
        self.name = name
        self._dir = tempfile.TemporaryDirectory(prefix=f"thunder-peer-{name.replace('/', '-')}-")
        self.log_path = Path(self._dir.name) / "log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"},
            )

    def wait_ready(self, probe: Callable[[], bool], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}): {self.log_tail()}"
                )
            try:
                if probe():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready within {timeout_s:.0f} s: {self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()


def answers_ok(url: str) -> bool:
    return httpx.get(url, timeout=2).status_code == 200


@contextmanager
def sim_engines(
    cluster: ClusterConfig, time_scale: float, pids: list[int] | None = None
) -> Iterator[list[str]]:
    """`cluster.engines` fresh `thunder-mw sim-engine` processes (vLLM flavour); their URLs
    (their process ids appended to `pids`)."""
    with ExitStack() as stack:
        urls, procs = [], []
        for i in range(cluster.engines):
            engine = cluster.engine_config(i)
            port = free_port()
            argv = [sys.executable, "-m", "thunder_mw.cli.main", "sim-engine", "--flavor", "vllm"]
            argv += ["--host", "127.0.0.1", "--port", str(port)]
            argv += ["--num-blocks", str(engine.num_blocks), "--block-size", str(engine.block_size)]
            argv += ["--max-num-seqs", str(engine.max_num_seqs)]
            argv += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
            argv += ["--max-model-len", str(engine.max_model_len), "--profile", engine.profile]
            argv += ["--time-scale", str(time_scale), "--seed", str(engine.seed)]
            proc = Process(argv, f"sim-engine-{i}")
            stack.callback(proc.close)
            urls.append(f"http://127.0.0.1:{port}")
            procs.append(proc)
            if pids is not None:
                pids.append(proc.proc.pid)
        for proc, url in zip(procs, urls, strict=True):
            proc.wait_ready(partial(answers_ok, f"{url}/health"))
        yield urls


@dataclass
class Router:
    """A running system under test: its URL, and where its evidence comes from."""

    system: System
    url: str
    process: Process | None = None
    gateway: Gateway | None = None
    metrics_url: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    pid: int | None = None

    @property
    def schedules_programs(self) -> bool:
        return "--enable-program-scheduling" in self.system.flags

    def collect(self) -> None:
        """What the router itself says it did (read after a run, before it stops)."""
        if self.schedules_programs:
            diag = httpx.get(f"{self.url}/scheduling/diagnostics", timeout=10).json()
            self.evidence["diagnostics"] = summarize_diagnostics(diag)
        if self.process is not None:
            self.evidence["log"] = summarize_log(self.process.log_text())
        if self.metrics_url is not None:
            try:
                text = httpx.get(self.metrics_url, timeout=5).text
                self.evidence["metrics"] = router_metrics(text)
            except httpx.HTTPError as exc:
                self.evidence["metrics_error"] = str(exc)


@contextmanager
def start_router(
    system: System,
    urls: list[str],
    cluster: ClusterConfig,
    time_scale: float,
    tuning: PeerTuning | None = None,
) -> Iterator[Router]:
    """`system` in front of the engines at `urls`, ready to serve, for a `with` block
    (`tuning`: a peer calibrated to the regime, peer_argv)."""
    port = free_port()
    if system.kind == "thunder-mw":
        from thunder_mw.benchmarks.scenarios import POLICIES

        assert system.pipeline is not None
        config = engines_gateway_config(urls, cluster, POLICIES[system.pipeline], time_scale, port)
        with Gateway(config) as gateway:
            yield Router(system, gateway.url, gateway=gateway, pid=gateway.pid)
        return
    metrics_port = free_port()
    argv = peer_argv(system, urls, port, metrics_port, cluster.kv_tokens, tuning)
    proc = Process(argv, system.name)
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_ready(lambda: serves_requests(url, system))
        yield Router(
            system,
            url,
            process=proc,
            metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
            pid=proc.proc.pid,
        )
    finally:
        proc.close()


def serves_requests(url: str, system: System) -> bool:
    """Ready = its readiness route answers 200 and it lists a model (its workers are in)."""
    if not answers_ok(f"{url}/readiness"):
        return False
    models = httpx.get(f"{url}/v1/models", timeout=2)
    return models.status_code == 200 and bool(models.json().get("data"))


# ------------------------------------------------------------------------------ evidence
def summarize_diagnostics(diag: dict[str, Any]) -> dict[str, Any]:
    """The vLLM router's /scheduling/diagnostics, reduced to what explains a run."""
    ranks = diag.get("ranks") or []
    keep = (
        "configured_token_capacity",
        "router_estimated_used_tokens",
        "vllm_kv_cache_usage",
        "capacity_accounting_source",
        "router_active_programs",
        "router_paused_reasoning_programs",
        "router_paused_acting_programs",
        "router_queued_programs",
        "observation_fresh",
    )
    states: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for rank in ranks:
        for program in rank.get("programs") or ():
            key = f"{program.get('state')}/{program.get('status')}"
            states[key] = states.get(key, 0) + 1
            reason = str(program.get("pause_reason"))
            reasons[reason] = reasons.get(reason, 0) + 1
    top = {k: v for k, v in diag.items() if not isinstance(v, list | dict)}
    return {
        **top,
        "ranks": [{k: r.get(k) for k in keep} | {"rolling": r.get("rolling")} for r in ranks],
        "program_states": states,
        "pause_reasons": reasons,
    }


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def summarize_log(text: str) -> dict[str, Any]:
    """Warnings and errors a router logged (counted; the first few kept)."""
    text = _ANSI.sub("", text)
    lines = [line for line in text.splitlines() if " WARN " in line or " ERROR " in line]
    return {"warnings_and_errors": len(lines), "first": [line[:300] for line in lines[:5]]}


def router_metrics(text: str) -> dict[str, float]:
    """The router's own counters that say what it did (retries, queueing, rejections),
    summed over label sets. Read line by line: vllm-router 0.1.17 writes some samples with
    a duplicated label, which the Prometheus parser refuses."""
    words = ("retr", "reject", "queue", "error", "fail", "admission", "pause", "program")
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith(("_bucket", "_created")) or not any(w in name for w in words):
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        totals[name] = totals.get(name, 0.0) + value
    return totals


class DiagnosticsSampler:
    """Polls the vLLM router's /scheduling/diagnostics during a run (once per wall second):
    the peaks of its queued and paused programs and the pause reasons it gave."""

    def __init__(self, url: str, interval_s: float = 1.0) -> None:
        self.url = url
        self.interval_s = interval_s
        self.peaks: dict[str, int] = {}
        self.pause_reasons: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DiagnosticsSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(self.interval_s):
                try:
                    diag = client.get(f"{self.url}/scheduling/diagnostics").json()
                except (httpx.HTTPError, ValueError):
                    continue
                self.samples += 1
                totals: dict[str, int] = {}
                for rank in diag.get("ranks") or ():
                    for key, value in rank.items():
                        if key.startswith("router_") and isinstance(value, int):
                            totals[key] = totals.get(key, 0) + value
                    for program in rank.get("programs") or ():
                        reason = program.get("pause_reason")
                        if reason:
                            self.pause_reasons[reason] = self.pause_reasons.get(reason, 0) + 1
                for key, value in totals.items():
                    self.peaks[key] = max(self.peaks.get(key, 0), value)

    def summary(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "peaks": self.peaks,
            "pause_reasons_sampled": self.pause_reasons,
        }


# ------------------------------------------------------------------------------ runs
def run_system(
    system: System,
    programs: list[ProgramSpec],
    cluster: ClusterConfig,
    *,
    time_scale: float,
    concurrency: int | None,
    stream: bool = False,
    tuning: PeerTuning | None = None,
    stop_at_window_end: bool = False,
) -> dict[str, Any]:
    """One run of `system` on fresh engines: the harness's metrics + the router's evidence,
    the machine's load average at its start and end and the CPU its processes used."""
    started = time.perf_counter()
    load_start = os.getloadavg()
    engine_pids: list[int] = []
    with (
        sim_engines(cluster, time_scale, engine_pids) as urls,
        start_router(system, urls, cluster, time_scale, tuning) as router,
    ):
        before = [read_counters([url], timeout_s=5) for url in urls]
        engines = {f"engine{i}": pid for i, pid in enumerate(engine_pids)}
        cpu = CpuMeter({"router": router.pid, **engines})
        client_cpu = time.process_time()  # the replay's (and the samplers') own process
        wall_replay = partial(lambda t0: time.monotonic() - t0, time.monotonic())
        clocks = EngineClocks(urls)
        replayer = Replayer(
            router.url,
            time_scale=time_scale,
            stream=stream,
            identity=system.identity,
            release=system.kind == "thunder-mw",
        )
        with ExitStack() as sampling:
            sampler = None
            if router.schedules_programs:
                sampler = sampling.enter_context(DiagnosticsSampler(router.url))
            result = asyncio.run(
                replayer.run(programs, concurrency, stop_at_last_start=stop_at_window_end)
            )
        cpu_per_wall_s = cpu.per_wall_second()
        cpu_per_wall_s["client"] = round((time.process_time() - client_cpu) / wall_replay(), 3)
        kept = clocks.time_scales()
        after = [read_counters([url], timeout_s=5) for url in urls]
        router.collect()
        if sampler is not None:
            router.evidence["during_run"] = sampler.summary()
    metrics = live_metrics(result, time_scale, _sum(before), _sum(after), concurrency)
    per_engine = [delta(b, a) for b, a in zip(before, after, strict=True)]
    generated = sum(d["generation_tokens"] for d in per_engine) or 1.0
    return {
        "system": system.name,
        **metrics,
        # How the router spread the work: each engine's share of the generated tokens.
        "engine_generation_share": [
            round(d["generation_tokens"] / generated, 3) for d in per_engine
        ],
        "engine_preemptions": [int(d["preemptions"]) for d in per_engine],
        "run_wall_s": round(time.perf_counter() - started, 1),
        # CPU seconds per wall second of the replay, per process (with its children): an
        # engine near 1 falls behind its time scale and the run's timing is distorted.
        "cpu_per_wall_s": cpu_per_wall_s,
        # Simulated seconds each engine advanced per wall second of the replay: the time
        # scale it kept (below the nominal one where it fell behind its steps' deadlines).
        "engine_time_scale": kept,
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "evidence": router.evidence,
    }


class CpuMeter:
    """CPU seconds per wall second of some processes (and their children) from now until
    `per_wall_second` (Linux /proc; None for a process it cannot read)."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self._pids = pids
        self.started = time.monotonic()
        self._before = {name: _cpu_seconds(pid) for name, pid in pids.items()}

    def per_wall_second(self) -> dict[str, float | None]:
        wall = time.monotonic() - self.started
        out: dict[str, float | None] = {}
        for name, pid in self._pids.items():
            before, now = self._before[name], _cpu_seconds(pid)
            ok = before is not None and now is not None and wall > 0
            out[name] = round((now - before) / wall, 3) if ok else None  # type: ignore[operator]
        return out


class EngineClocks:
    """The time scale simulated engines keep: their clocks read `delay_s` wall seconds from
    now (the engines busy by then: an idle engine's clock moves only when it wakes) and
    again at `time_scales`."""

    def __init__(self, urls: list[str], delay_s: float = 5.0) -> None:
        self._urls = urls
        self._first: tuple[float, list[float]] | None = None
        self._thread = threading.Timer(delay_s, self._read_first)
        self._thread.daemon = True
        self._thread.start()

    def _read_first(self) -> None:
        try:
            self._first = (time.monotonic(), [_sim_time(url) for url in self._urls])
        except (httpx.HTTPError, KeyError, ValueError):
            pass

    def time_scales(self) -> list[float] | None:
        self._thread.cancel()
        self._thread.join()
        if self._first is None:
            return None
        wall = time.monotonic() - self._first[0]
        now = [_sim_time(url) for url in self._urls]
        return [round((b - a) / wall, 2) for a, b in zip(self._first[1], now, strict=True)]


def _sim_time(url: str) -> float:
    """A simulated engine's clock (`thunder-mw sim-engine`'s /debug/state)."""
    return float(httpx.get(f"{url}/debug/state", timeout=10).json()["sim_time_s"])


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process `pid` and its live descendants."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += _cpu_seconds(int(child)) or 0.0
    except (OSError, ValueError, IndexError):
        return None
    return total


def _sum(counters: list[dict[str, float]]) -> dict[str, float]:
    return {key: sum(c[key] for c in counters) for key in counters[0]}


# ------------------------------------------------------------------------------ the benchmark
LIVE_PEERS = Scenario(
    name="live-peers",
    description="thunder-mw beside the routers users run (vLLM router, SGLang gateway), live "
    "in front of 2 simulated 8B engines: a closed loop of 16 swe-agent programs past the KV "
    "knee, 48 in all; in des mode the same scenario runs the peers' stand-ins",
    workload="swe-agent",
    engines=2,
    programs_per_engine=8,
    total_factor=3.0,
    kv_tokens=32_768,
    max_model_len=16_384,
    arrival="closed",
    policies=tuple(dict.fromkeys(SYSTEMS[s].stand_in for s in DEFAULT_SYSTEMS)),
)


@dataclass(frozen=True, slots=True)
class LiveRegime:
    """A live-peers setup: the scenario (fleet, workload, closed loop), the published one it
    scales down (None: none), whether each peer is tuned to it (PeerTuning) and the time
    scale its results were measured at (the documented command's `--time-scale`)."""

    scenario: Scenario
    published: str | None = None
    tune_peers: bool = False
    time_scale: float = 20.0
    tolerance: float = 0.15  # a live system and its DES stand-in agree within this

    def tuning(self, time_scale: float) -> PeerTuning | None:
        if not self.tune_peers:
            return None
        cluster = scenario_cluster(self.scenario, 0)
        return PeerTuning(time_scale, get_profile(cluster.profile), cluster.max_num_batched_tokens)


# Systems of the published regimes: those the issue names (no vllm-router/cache_aware).
REGIME_SYSTEMS = (
    "thunder-mw",
    "round_robin",
    "vllm-router/program",
    "smg/cache_aware",
    "smg/consistent_hashing",
)


def scaled_down(
    name: str, published: str, per_engine: int, max_model_len: int, note: str
) -> Scenario:
    """Published scenario `published` on its own fleet (engines, cost profile, workload)
    with `per_engine` programs per engine instead of its own and each engine's KV capacity
    scaled alike (`kv_scale`: the profile's capacity x per_engine / published per engine, so
    resident contexts / capacity is unchanged); a closed loop of 3x the concurrency ending
    at the steady window's end. `max_model_len` must fit the scaled KV (contexts past it are
    compacted by the workload generator)."""
    base = PUBLISHED_SCENARIOS[published]
    kv_scale = per_engine / base.programs_per_engine
    return Scenario(
        name=name,
        description=f"{published} scaled down to {per_engine} programs per engine "
        f"({base.engines} engines, {base.profile}, {base.workload}, KV x {kv_scale:.4g}), "
        f"live against the real peers, tuned to the regime; {note}",
        workload=base.workload,
        engines=base.engines,
        programs_per_engine=per_engine,
        total_factor=3.0,
        kv_tokens=None,
        kv_scale=kv_scale,
        profile=base.profile,
        max_model_len=max_model_len,
        arrival="closed",
        stop_at_window_end=True,
        policies=tuple(dict.fromkeys(SYSTEMS[s].stand_in for s in REGIME_SYSTEMS)),
        split="test",
    )


LIVE_REGIMES: dict[str, LiveRegime] = {
    r.scenario.name: r
    for r in (
        LiveRegime(LIVE_PEERS),
        LiveRegime(
            scaled_down(
                "live-peers-glm46",
                "paper-rollout-2node",
                8,
                65_536,
                "Table 2's two GLM-4.6 8xH100 engines (the paper-swe-glm46 profile and workload)",
            ),
            "paper-rollout-2node",
            tune_peers=True,
            time_scale=30.0,
            tolerance=0.10,
        ),
        LiveRegime(
            scaled_down(
                "live-peers-minimax",
                "dynamo-minimax",
                8,
                49_152,
                "Dynamo's two TP4 MiniMax-M2 replicas",
            ),
            "dynamo-minimax",
            tune_peers=True,
            time_scale=40.0,
            tolerance=0.10,
        ),
    )
}
SUMMARY_KEYS = (
    "steps_per_min_steady",
    "steps_per_min",
    "jct_mean_s",
    "jct_p95_s",
    "jct_max_s",
    "prefix_hit_rate",
    "preemptions",
    "failed_calls",
)


def peer_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in PEER_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def scenario_cluster(scenario: Scenario, seed: int) -> ClusterConfig:
    """The fleet the live run serves (sim-engine processes) and its DES stand-ins simulate;
    the stand-ins read the waiting count as those engines' /metrics report it, vLLM's gauge
    (sim/_metrics.py), as the live gateways and routers do."""
    return ClusterConfig(
        engines=scenario.engines,
        kv_tokens=kv_tokens_of(scenario),
        max_model_len=scenario.max_model_len,
        profile=scenario.profile,
        seed=seed,
        waiting="gauge",
    )


def scenario_programs(scenario: Scenario, seed: int) -> list[ProgramSpec]:
    count = round(scenario.concurrency * scenario.total_factor)
    return generate(scenario.workload, count, seed=seed, max_context_tokens=scenario.max_model_len)


def des_stand_in(scenario: Scenario, policy: str, seed: int) -> dict[str, Any]:
    """The stand-in `policy` on the scenario's programs and fleet in the discrete-event
    harness (what `thunder-mw bench --scenario live-peers` runs)."""
    from thunder_mw.benchmarks.des import Arrivals, simulate
    from thunder_mw.benchmarks.scenarios import POLICIES

    arrivals = Arrivals(
        "closed", scenario.concurrency, stop_at_window_end=scenario.stop_at_window_end
    )
    result = simulate(
        scenario_programs(scenario, seed),
        POLICIES[policy],
        scenario_cluster(scenario, seed),
        arrivals,
        policy,
    )
    return result.metrics


def run_peers(
    systems: list[str],
    *,
    regime: LiveRegime = LIVE_REGIMES[LIVE_PEERS.name],
    seed: int = 0,
    repeats: int = 3,
    time_scale: float = 20.0,
    stream: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every system `repeats` times, systems alternating within each round (round r replays
    the workload of seed + r, the same programs for every system), each run on fresh
    engines; beside each, its DES stand-in on the same programs; the result document."""
    from thunder_mw.benchmarks.scenarios import POLICIES

    scenario = regime.scenario
    tuning = regime.tuning(time_scale)
    load_start = os.getloadavg()
    missing = [n for n in systems if SYSTEMS[n].kind != "thunder-mw"]
    if missing:
        for kind in {SYSTEMS[n].kind for n in missing}:
            peer_executable(kind)  # PeerMissing with the install hint
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    for r in range(repeats):
        programs = scenario_programs(scenario, seed + r)
        cluster = scenario_cluster(scenario, seed + r)
        order = systems[r % len(systems) :] + systems[: r % len(systems)]  # rotate the order
        for name in order:
            run = run_system(
                SYSTEMS[name],
                programs,
                cluster,
                time_scale=time_scale,
                concurrency=scenario.concurrency,
                stream=stream,
                tuning=tuning,
                stop_at_window_end=scenario.stop_at_window_end,
            )
            run["round"], run["seed"] = r, seed + r
            runs.append(run)
            log(
                f"round {r} {name}: {run['steps_per_min_steady']} steps/min steady, "
                f"jct {run['jct_mean_s']} s, hit {run['prefix_hit_rate']}, "
                f"preempt {run['preemptions']}, failed calls {run['failed_calls']}, "
                f"{run['run_wall_s']} s, cpu/wall {run['cpu_per_wall_s']}, "
                f"load {run['load_avg_start'][0]}->{run['load_avg_end'][0]}"
            )
    stand_ins = sorted({SYSTEMS[n].stand_in for n in systems if SYSTEMS[n].stand_in in POLICIES})
    des = simulate_stand_ins(scenario, stand_ins, [seed + r for r in range(repeats)])
    summary = {name: summarize([x for x in runs if x["system"] == name]) for name in systems}
    return {
        "scenario": scenario.name,
        "mode": "live-peers",
        "seed": seed,
        "config": {
            "workload": scenario.workload,
            "engines": scenario.engines,
            "engine": "thunder-mw sim-engine (vllm flavour), one process per engine, fresh per run",
            "concurrency": scenario.concurrency,
            "programs": round(scenario.concurrency * scenario.total_factor),
            "arrival": "closed",
            "stop_at_window_end": scenario.stop_at_window_end,
            "published": regime.published,
            "kv_scale": scenario.kv_scale,
            "kv_tokens_per_engine": scenario_cluster(scenario, seed).kv_tokens,
            "profile": scenario.profile,
            "max_model_len": scenario.max_model_len,
            "time_scale": time_scale,
            "repeats": repeats,
            "seeds": [seed + r for r in range(repeats)],
            "stream": stream,
            "peer_versions": peer_versions(),
            "systems": {n: describe(SYSTEMS[n]) for n in systems},
            "peer_tuning": describe_tuning(tuning, scenario_cluster(scenario, seed).kv_tokens),
            "stand_ins": {p: POLICIES[p] for p in stand_ins},
            "tolerance": regime.tolerance,
        },
        "summary": summary,
        "paired": paired(systems, runs),
        "agreement": agreement(systems, runs, des, regime.tolerance),
        "des": {p: [_des_row(m) for m in rows] for p, rows in des.items()},
        "runs": runs,
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }


def simulate_stand_ins(
    scenario: Scenario, policies: list[str], seeds: list[int]
) -> dict[str, list[dict[str, Any]]]:
    """Each stand-in on each seed's programs and fleet (index r: round r's seed)."""
    return {policy: [des_stand_in(scenario, policy, s) for s in seeds] for policy in policies}


def paired(systems: list[str], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """thunder-mw over each other system on steady steps/min, paired by round (the same
    programs): the ratio of means with its 95 % bootstrap interval and verdict (win / tie /
    loss: the interval above, holding or below 1.0); None under 2 rounds."""
    from thunder_mw.benchmarks import bootstrap

    key = "steps_per_min_steady"
    ours = {r["round"]: r[key] for r in runs if r["system"] == "thunder-mw" and r.get(key)}
    out: dict[str, Any] = {}
    for name in systems:
        if name == "thunder-mw" or not ours:
            continue
        theirs = {r["round"]: r[key] for r in runs if r["system"] == name and r.get(key)}
        rounds = sorted(ours.keys() & theirs.keys())
        out[f"thunder-mw/{name}"] = (
            bootstrap.compare([ours[k] for k in rounds], [theirs[k] for k in rounds])
            if len(rounds) >= 2
            else None
        )
    return out


def resimulate(report: dict[str, Any]) -> dict[str, Any]:
    """A result file's DES half redone with the code as it is now (its live runs kept): the
    stand-ins of its systems on its seeds, `des`, `agreement` and `paired` rewritten."""
    from thunder_mw.benchmarks.scenarios import POLICIES

    regime = LIVE_REGIMES[report["scenario"]]
    systems = list(report["summary"])
    stand_ins = sorted({SYSTEMS[n].stand_in for n in systems if SYSTEMS[n].stand_in in POLICIES})
    des = simulate_stand_ins(regime.scenario, stand_ins, list(report["config"]["seeds"]))
    report["config"]["stand_ins"] = {p: POLICIES[p] for p in stand_ins}
    report["config"]["tolerance"] = regime.tolerance
    report["config"]["systems"] = {n: describe(SYSTEMS[n]) for n in systems}
    report["paired"] = paired(systems, report["runs"])
    report["agreement"] = agreement(systems, report["runs"], des, regime.tolerance)
    report["des"] = {p: [_des_row(m) for m in rows] for p, rows in des.items()}
    return report


def describe_tuning(tuning: PeerTuning | None, kv_tokens: int) -> dict[str, Any] | None:
    """What the peers were told beyond their defaults (None: only the KV capacity)."""
    if tuning is None:
        return None
    return {
        "time_scale": tuning.time_scale,
        "vllm_router_program_config": vllm_router_program_config(kv_tokens, tuning),
        "smg_flags": smg_timer_flags(tuning.time_scale),
        "not_scaled": "smg's fault-detection timers (worker stall/wedge, health checks, "
        "circuit breaker); the peers' HTTP timeouts",
    }


def describe(system: System) -> dict[str, Any]:
    fields, headers = system.identity("PROGRAM", 0, False)
    return {
        "kind": system.kind,
        "flags": list(system.flags) or None,
        "pipeline": system.pipeline,
        "program_identity": {"body": fields or None, "headers": headers or None},
        "stand_in": system.stand_in,
        "notes": system.notes or None,
    }


def _des_row(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: metrics.get(k) for k in (*SUMMARY_KEYS, "steady_window_s", "warmup_s")}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """min / median / max of each headline metric over a system's runs."""
    out: dict[str, Any] = {}
    for key in SUMMARY_KEYS:
        values = sorted(v for v in (r.get(key) for r in runs) if v is not None)
        if values:
            out[key] = {"min": values[0], "median": _median(values), "max": values[-1]}
    return out


def _median(values: list[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else round((values[mid - 1] + values[mid]) / 2, 2)


def agreement(
    systems: list[str],
    runs: list[dict[str, Any]],
    des: dict[str, list[dict[str, Any]]],
    tolerance: float = 0.15,
) -> list[dict[str, Any]]:
    """Per system: live steps/min over its DES stand-in's, run by run (same seed), for the
    steady-state and whole-run figures; agreed = the median steady ratio within tolerance."""
    rows: list[dict[str, Any]] = []
    for name in systems:
        stand_in = SYSTEMS[name].stand_in
        if stand_in not in des:
            rows.append({"system": name, "stand_in": stand_in, "agreed": None})
            continue
        mine = sorted((r for r in runs if r["system"] == name), key=lambda r: r["round"])
        ratios: dict[str, list[float]] = {"steps_per_min_steady": [], "steps_per_min": []}
        for run in mine:
            sim = des[stand_in][run["round"]]
            for key, values in ratios.items():
                if run.get(key) and sim.get(key):
                    values.append(round(run[key] / sim[key], 3))
        steady = sorted(ratios["steps_per_min_steady"])
        median = _median(steady) if steady else None
        rows.append(
            {
                "system": name,
                "stand_in": stand_in,
                "live_over_des_steady": steady,
                "live_over_des_whole_run": sorted(ratios["steps_per_min"]),
                "median_steady_ratio": median,
                "agreed": None if median is None else abs(median - 1) <= tolerance,
            }
        )
    return rows


def format_report(report: dict[str, Any]) -> str:
    """The table: per system min / median / max over its runs, and the stand-in check."""
    head = ["system", "steady/min", "steps/min", "JCT mean", "JCT p95", "JCT max", "hit"]
    head += ["preempt", "failed calls"]
    rows = [head]
    for name, row in report["summary"].items():
        cells = [name]
        for key in SUMMARY_KEYS:
            cell = row.get(key)
            cells.append("-" if cell is None else f"{cell['min']}/{cell['median']}/{cell['max']}")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.append("(min/median/max over the runs)")
    for pair, cell in (report.get("paired") or {}).items():
        if cell is not None:
            lines.append(
                f"{pair} steady steps/min: {cell['ratio']} {cell['ci95']} ({cell['verdict']})"
            )
    for row in report["agreement"]:
        if row["agreed"] is None:
            lines.append(f"{row['system']}: no DES stand-in {row['stand_in']!r}")
            continue
        verdict = "agrees" if row["agreed"] else "DIFFERS"
        lines.append(
            f"{row['system']} vs DES {row['stand_in']}: live/des steady "
            f"{row['live_over_des_steady']} (median {row['median_steady_ratio']}, {verdict}), "
            f"whole run {row['live_over_des_whole_run']}"
        )
    return "\n".join(lines)


def write_plot(report: dict[str, Any], path: Path) -> Path | None:
    """Steady steps/min, mean JCT and prefix hit rate per system: each run a dot, the
    median a bar, the DES stand-in's median a cross."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return None
    systems = list(report["summary"])
    panels = (
        ("steps_per_min_steady", "steady-state LLM steps / min"),
        ("jct_mean_s", "mean JCT (s)"),
        ("prefix_hit_rate", "engines' prefix hit rate"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for i, name in enumerate(systems):
            values = [
                r[key] for r in report["runs"] if r["system"] == name and r.get(key) is not None
            ]
            cell = report["summary"][name].get(key)
            if cell:
                ax.bar(
                    i, cell["median"], color="#9ab" if name != "thunder-mw" else "#e94", alpha=0.8
                )
            ax.plot([i] * len(values), values, "k.", markersize=5)
            stand_in = report["config"]["systems"][name]["stand_in"]
            sims = [m.get(key) for m in report["des"].get(stand_in, []) if m.get(key) is not None]
            if sims:
                ax.plot(
                    i,
                    _median(sorted(sims)),
                    "rx",
                    markersize=9,
                    label="DES stand-in" if i == 0 else None,
                )
        ax.set_xticks(range(len(systems)), systems, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(
        f"{report['scenario']}: {report['config']['concurrency']} programs in flight over "
        f"{report['config']['engines']} simulated engines, {report['config']['repeats']} runs each",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def run_bench(args: Any) -> int:
    """`thunder-mw bench --scenario live-peers --mode live`: the systems themselves
    (`--policies` picks systems by name), or `--resimulate` of such a run's DES half; the
    exit status. (Their stand-ins alone in the DES run as any scenario does: bench_cli.py.)"""
    results = args.results_dir if getattr(args, "results_dir", None) else RESULTS_DIR
    regime = LIVE_REGIMES[getattr(args, "scenario", LIVE_PEERS.name)]
    scenario = regime.scenario
    if getattr(args, "resimulate", False):
        path = args.output or results / f"{scenario.name}.json"
        report = resimulate(json.loads(path.read_text()))
        write_result(path, report, indent=1)
        print(format_report(report))
        print(f"\nDES half redone; written to {path}")
        return 0
    default = DEFAULT_SYSTEMS if regime.published is None else REGIME_SYSTEMS
    systems = args.policies.split(",") if args.policies else list(default)
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        print(f"unknown systems {unknown}; known: {list(SYSTEMS)}", file=sys.stderr)
        return 2
    try:
        report = run_peers(
            systems,
            regime=regime,
            seed=args.seed,
            repeats=args.repeats,
            time_scale=args.time_scale,
            stream=args.live_stream,
            log=lambda line: print(line, flush=True),
        )
    except PeerMissing as exc:
        print(f"live-peers: {exc}", file=sys.stderr)
        return 2
    output = args.output or results / f"{scenario.name}.json"
    write_result(output, report, indent=1)
    print(format_report(report))
    print(f"\nwall {report['wall_s']} s; written to {output}")
    if not args.no_plots:
        plot = write_plot(report, output.with_suffix(".png"))
        if plot is not None:
            print(f"plot: {plot}")
    return 0
