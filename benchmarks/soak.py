"""Soak: thousands of programs that never release, over many idle-expiry periods.

A gateway that forgets to forget grows until it dies. This drives the real gateway
(`thunder-mw serve`, its own process) in front of two simulated vLLM engines (their own
processes, so the gateway's memory is measured alone) with programs that each make one or
two short calls under a unique program id and then go silent, never calling
/programs/release: only the `gc_hooks` idle expiry ends them. Every `--sample-s` it records
the gateway's resident memory (VmRSS from /proc) and what it says it holds: live programs
(/health), the `thunder_mw_programs` gauges and expiries (/metrics), profiles (/profiles).
After the last program it waits out the expiry and the profiles' retention, then checks
that nothing is left.

    python -m thunder_mw.benchmarks.soak [--programs 10000] [--output PATH]

Writes `results/soak.json` (config, samples, summary) and `results/soak.png`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from thunder_mw.benchmarks.live import Gateway
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.server_process import wait_until_healthy
from thunder_mw.sim.ports import free_port

__all__ = [
    "DEFAULT_OUTPUT",
    "HOST",
    "MIB",
    "MODEL",
    "Load",
    "gateway_config",
    "main",
    "plot",
    "rss_mib",
    "sample",
    "sim_engines",
    "soak",
    "summarize",
]

DEFAULT_OUTPUT = RESULTS_DIR / "soak.json"
HOST = "127.0.0.1"
MODEL = "sim-model"
MIB = 1024 * 1024


# ------------------------------------------------------------------ processes
@contextmanager
def sim_engines(count: int) -> Iterator[list[tuple[str, int]]]:
    """`thunder-mw sim-engine` processes; yields (url, pid) of each once it answers."""
    procs: list[tuple[subprocess.Popen[bytes], str]] = []
    try:
        for seed in range(count):
            port = free_port()
            args = ["--port", str(port), "--seed", str(seed), "--model-name", MODEL]
            args += ["--time-scale", "1000", "--num-blocks", "4096", "--log-level", "warning"]
            proc = subprocess.Popen(
                [sys.executable, "-m", "thunder_mw.cli.main", "sim-engine", *args],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append((proc, f"http://{HOST}:{port}"))
        for proc, url in procs:
            wait_until_healthy(url, timeout_s=60, process=proc)
        yield [(url, proc.pid) for proc, url in procs]
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def gateway_config(args: argparse.Namespace, engine_urls: list[str]) -> dict[str, Any]:
    return {
        "server": {
            "host": HOST,
            "port": free_port(),
            "log_level": "warning",
            "tick_interval_s": args.tick_s,
            "probe_interval_s": 1.0,
        },
        "backends": [
            {"name": f"sim-{i}", "type": "vllm", "url": url} for i, url in enumerate(engine_urls)
        ],
        "policies": [
            {"admission": {"overflow": "hold"}},
            {"state_aware_pause": {}},
            {"migration": {}},
            {"gc_hooks": {"idle_ttl_s": args.ttl_s}},
        ],
        "observability": {
            "decision_log": False,  # 20,000 INFO lines would measure the log, not the gateway
            "profiles": {"retention_s": args.retention_s},
        },
        "tools": {"docker": {"enabled": False}},
    }


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no VmRSS for pid {pid}")


# ------------------------------------------------------------------ load
class Load:
    """Starts programs at a fixed rate (at most `concurrency` at once) and counts outcomes."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url = url
        self.args = args
        self.started = 0
        self.finished = 0
        self.calls = 0
        self.errors: dict[str, int] = {}

    async def run(self, session: aiohttp.ClientSession) -> None:
        args = self.args
        interval = args.duration_s / args.programs
        slots = asyncio.Semaphore(args.concurrency)
        tasks: set[asyncio.Task[None]] = set()
        next_start = time.monotonic()
        for i in range(args.programs):
            delay = next_start - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            # Behind schedule (a slow machine), the rate stays the same rather than bursting
            # to catch up: a burst would set a memory high-water mark that hides later growth.
            next_start = max(next_start, time.monotonic()) + interval
            await slots.acquire()
            self.started += 1
            task = asyncio.create_task(self._program(session, i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            task.add_done_callback(lambda _: slots.release())
        await asyncio.gather(*tasks)

    async def _program(self, session: aiohttp.ClientSession, i: int) -> None:
        program_id = f"soak-{i:05d}"
        for call in range(1 + i % 2):  # 1 or 2 calls, then silence: never released
            stream = call % 2 == 1
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"program {i} step {call}: go on"}],
                "max_tokens": 4,
                "stream": stream,
                "program_id": program_id,
            }
            try:
                async with session.post(f"{self.url}/v1/chat/completions", json=body) as r:
                    await r.read()
                    if r.status != 200:
                        self._error(f"status {r.status}")
            except (TimeoutError, aiohttp.ClientError) as exc:
                self._error(type(exc).__name__)
            self.calls += 1
        self.finished += 1

    def _error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


def _metric_sum(text: str, name: str, label: str | None = None) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if label is None or label in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


async def sample(
    session: aiohttp.ClientSession, url: str, pid: int, load: Load, t0: float
) -> dict[str, Any]:
    async with session.get(f"{url}/health") as r:
        health = await r.json()
    async with session.get(f"{url}/metrics") as r:
        metrics = await r.text()
    async with session.get(f"{url}/profiles") as r:
        profiles = (await r.json())["count"]
    return {
        "t": round(time.monotonic() - t0, 2),
        "programs_sent": load.started,
        "programs_done": load.finished,
        "calls": load.calls,
        "rss_mib": round(rss_mib(pid), 2),
        "live_programs": health["programs"],
        "programs_gauge": int(_metric_sum(metrics, "thunder_mw_programs")),
        "expired_total": int(
            _metric_sum(metrics, "thunder_mw_programs_released_total", 'reason="expired"')
        ),
        "queue": int(_metric_sum(metrics, "thunder_mw_queue_programs")),
        "profiles": profiles,
    }


async def soak(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    load = Load(url, args)
    samples: list[dict[str, Any]] = []
    connector = aiohttp.TCPConnector(limit=args.concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.monotonic()
        samples.append(await sample(session, url, pid, load, t0))
        driving = asyncio.create_task(load.run(session))
        while not driving.done():
            await asyncio.wait({driving}, timeout=args.sample_s)
            samples.append(await sample(session, url, pid, load, t0))
        await driving
        load_end_t = samples[-1]["t"]
        # Everything expires within ttl + a tick; profiles go retention_s after that.
        drain_until = time.monotonic() + args.ttl_s + args.retention_s + args.tail_s
        while time.monotonic() < drain_until:
            await asyncio.sleep(args.sample_s)
            samples.append(await sample(session, url, pid, load, t0))
    return {
        "samples": samples,
        "load_end_t": load_end_t,
        "calls": load.calls,
        "errors": load.errors,
    }


# ------------------------------------------------------------------ summary and plot
def _slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def summarize(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    samples = run["samples"]
    warm_programs = int(args.programs * args.warmup_fraction)
    loaded = [s for s in samples if s["t"] <= run["load_end_t"]]
    steady = [s for s in loaded if s["programs_sent"] >= warm_programs]
    warm, end, last = steady[0], loaded[-1], samples[-1]
    slope = _slope([s["programs_sent"] / 1000 for s in steady], [s["rss_mib"] for s in steady])
    return {
        "programs": args.programs,
        "calls": run["calls"],
        "errors": run["errors"],
        "expiry_periods": round(run["load_end_t"] / args.ttl_s, 1),
        "warmup_programs": warm_programs,
        "rss_start_mib": samples[0]["rss_mib"],
        "rss_after_warmup_mib": warm["rss_mib"],
        "rss_end_of_load_mib": end["rss_mib"],
        "rss_max_after_warmup_mib": max(s["rss_mib"] for s in steady),
        "rss_final_mib": last["rss_mib"],
        "rss_growth_after_warmup_mib": round(end["rss_mib"] - warm["rss_mib"], 2),
        "rss_slope_mib_per_1000_programs": round(slope, 3),
        "live_programs_peak": max(s["live_programs"] for s in samples),
        "profiles_peak": max(s["profiles"] for s in samples),
        "final_live_programs": last["live_programs"],
        "final_programs_gauge": last["programs_gauge"],
        "final_profiles": last["profiles"],
        "final_queue": last["queue"],
        "expired_total": last["expired_total"],
        "all_expired": last["expired_total"] == args.programs and last["live_programs"] == 0,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, summary = result["samples"], result["summary"]
    t = [s["t"] for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    top.plot(t, [s["rss_mib"] for s in samples], color="tab:red", label="gateway RSS")
    warm_t = next(s["t"] for s in samples if s["programs_sent"] >= summary["warmup_programs"])
    for ax in (top, bottom):
        ax.axvline(warm_t, color="grey", ls=":", lw=1)
        ax.axvline(result["load_end_t"], color="grey", ls="--", lw=1)
        ax.grid(alpha=0.3)
    top.set_ylabel("resident memory (MiB)")
    top.set_ylim(0, max(s["rss_mib"] for s in samples) * 1.15)
    top.set_title(
        f"Soak: {summary['programs']:,} never-released programs, idle TTL "
        f"{result['config']['ttl_s']:g} s ({summary['expiry_periods']:g} periods); RSS after "
        f"warm-up {summary['rss_after_warmup_mib']:.1f} → {summary['rss_end_of_load_mib']:.1f} "
        f"MiB ({summary['rss_slope_mib_per_1000_programs']:+.2f} MiB / 1000 programs)",
        fontsize=9,
    )
    top.legend(loc="lower right", fontsize=8)
    bottom.plot(t, [s["live_programs"] for s in samples], label="live programs (/health)")
    bottom.plot(t, [s["profiles"] for s in samples], label="profiles held (/profiles)", ls="-.")
    bottom.set_ylabel("programs held")
    bottom.set_xlabel("wall time (s)   ·· warm-up ends   -- last program sent")
    sent = bottom.twinx()
    sent.plot(t, [s["programs_sent"] for s in samples], color="black", lw=0.8, label="sent")
    sent.plot(t, [s["expired_total"] for s in samples], color="tab:green", lw=0.8, label="expired")
    sent.set_ylabel("programs (cumulative)")
    lines = bottom.get_legend_handles_labels()
    more = sent.get_legend_handles_labels()
    bottom.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------ command line
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--programs", type=int, default=10_000)
    p.add_argument("--duration-s", type=float, default=120.0, help="time to start them all")
    p.add_argument("--concurrency", type=int, default=32, help="programs running at once")
    p.add_argument("--ttl-s", type=float, default=4.0, help="gc_hooks idle_ttl_s")
    p.add_argument("--retention-s", type=float, default=4.0, help="profiles retention_s")
    p.add_argument("--tick-s", type=float, default=0.25, help="server tick_interval_s")
    p.add_argument("--sample-s", type=float, default=1.0)
    p.add_argument("--tail-s", type=float, default=6.0, help="sampling after the last expiry")
    p.add_argument("--warmup-fraction", type=float, default=0.2)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)

    wall0 = time.monotonic()
    with ExitStack() as stack:
        engines = stack.enter_context(sim_engines(args.engines))
        gateway = stack.enter_context(Gateway(gateway_config(args, [u for u, _ in engines])))
        assert gateway.pid is not None
        run = asyncio.run(soak(gateway.url, gateway.pid, args))
        engine_rss = [round(rss_mib(pid), 1) for _, pid in engines]
    result = {
        "scenario": "soak",
        "config": {
            **{k: v for k, v in vars(args).items() if k not in ("output", "no_plot")},
            "calls_per_program": "1 or 2 (1 + i % 2), max_tokens 4, the second streamed",
            "pipeline": "admission (overflow: hold), state_aware_pause, migration, gc_hooks "
            "(defaults but TTL)",
            "engines": f"{args.engines} x thunder-mw sim-engine (vLLM API), separate processes",
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "summary": summarize(run, args),
        "engine_rss_final_mib": engine_rss,
        "load_end_t": run["load_end_t"],
        "wall_s": round(time.monotonic() - wall0, 1),
        "samples": run["samples"],
    }
    write_result(args.output, result, indent=1)
    if not args.no_plot:
        plot(result, args.output.with_suffix(".png"))
    print(json.dumps({**result["summary"], "wall_s": result["wall_s"]}, indent=1))
    return 0 if result["summary"]["all_expired"] else 1


if __name__ == "__main__":
    sys.exit(main())
