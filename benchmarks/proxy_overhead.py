"""Scenario `proxy-overhead`: what thunder-mw costs per request compared with a bare pass-through.

Three targets in front of the same microsecond-fast fake engine, each server in its own
process: `direct` (no proxy), `aiohttp-passthrough` (about the best a plain Python
pass-through does) and `thunder-mw` (the gateway doing all its work: context parsing and
stripping, scheduling, usage capture). For each target, non-streaming and streaming
(20 SSE chunks), at each concurrency: req/s over repeated windows (min/median/max) and
latency p50/p99, with the latency each proxy adds over `direct` and its req/s as a ratio
of the aiohttp pass-through's.

    python -m thunder_mw.benchmarks.proxy_overhead [--duration S] [--output PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import msgspec

from thunder_mw.benchmarks import http_load
from thunder_mw.benchmarks.fake_engine import STREAM_CHUNKS, new_event_loop
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.server_process import stop_process, wait_until_healthy
from thunder_mw.policies.stats import percentile
from thunder_mw.sim.ports import free_port

__all__ = [
    "ALL_TARGETS",
    "DEFAULT_OUTPUT",
    "HOST",
    "REFERENCE_TARGETS",
    "SCENARIO",
    "TARGETS",
    "add_arguments",
    "chat_body",
    "format_table",
    "http_request",
    "main",
    "run",
]

SCENARIO = "proxy-overhead"
TARGETS = ("direct", "aiohttp-passthrough", "thunder-mw")
# Opt-in reference points: a bare ASGI pass-through on uvicorn, per HTTP client.
REFERENCE_TARGETS = ("asgi-httpx", "asgi-httpx-aiohttp", "asgi-aiohttp")
ALL_TARGETS = TARGETS + REFERENCE_TARGETS
DEFAULT_OUTPUT = RESULTS_DIR / "proxy-overhead.json"
HOST = "127.0.0.1"

_SYSTEM = (
    "You are a software engineering agent working in a sandboxed repository. Use the tools "
    "to inspect files, run commands and edit code. Think step by step, keep changes minimal, "
    "and run the tests before you finish. Never touch files outside the repository."
)
_USER = (
    "The test suite fails on test_parse_config with a KeyError on 'timeout'. Find the cause "
    "in the configuration loader, fix it without changing the public API, and explain the fix "
    "in one paragraph. The repository uses Python 3.11 and pytest."
)
_TOOL_OUTPUT = (
    "config/loader.py:42:    timeout = raw['timeout']\n"
    "config/loader.py:43:    retries = raw.get('retries', 3)\n"
    "tests/test_config.py:17:    cfg = parse_config({'retries': 1})\n"
    "E   KeyError: 'timeout'\n"
    "1 failed, 48 passed in 0.91s"
)


def chat_body(program_id: str, stream: bool) -> bytes:
    """A realistic agent step (~1 KB of messages) carrying a ThunderAgent-style program id."""
    body: dict[str, Any] = {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": _USER},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"cmd": "grep -rn timeout"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": _TOOL_OUTPUT},
        ],
        "max_tokens": 256,
        "temperature": 0.0,
        "stream": stream,
        "program_id": program_id,
    }
    return msgspec.json.encode(body)


def http_request(port: int, body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: %b:%d\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
        % (HOST.encode(), port, len(body), body)
    )


# --- server processes ---------------------------------------------------------------------


@contextmanager
def _process(
    cmd: Sequence[str], log_path: Path, *, prints_port: bool = True
) -> Iterator[subprocess.Popen[bytes]]:
    # Only a `PORT <n>` line is read from stdout; anything else goes to the log, where a
    # full pipe nobody reads cannot stall the server.
    with open(log_path, "wb") as log:
        stdout = subprocess.PIPE if prints_port else log
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=log)
    try:
        yield proc
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def _read_port(proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 30) -> int:
    """The `PORT <n>` line a benchmark server prints once it listens."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline().decode()
            if line.startswith("PORT "):
                return int(line.split()[1])
            if not line:
                break
    raise RuntimeError(f"{proc.args!r} did not start:\n{log_path.read_text()[-3000:]}")


def _python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _gateway_command(config_path: Path, port: int) -> list[str]:
    # Through the console script's entry point, so PATH does not matter.
    entry = "import sys; from thunder_mw.cli.main import main; sys.exit(main())"
    return [
        sys.executable,
        "-c",
        entry,
        "serve",
        "--config",
        str(config_path),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


def _gateway_yaml(engine_port: int) -> str:
    return (
        "server: {host: 127.0.0.1, port: 0}\n"
        "backends:\n"
        f'  - {{name: fake, type: vllm, url: "http://127.0.0.1:{engine_port}", '
        "capacity_tokens: 100000000}\n"
    )


@contextmanager
def _servers(targets: Sequence[str], workdir: Path) -> Iterator[dict[str, tuple[int, int]]]:
    """Start the engine and the proxies named in `targets`; yield {target: (port, pid)}."""
    with ExitStack() as stack:
        log = workdir / "engine.log"
        engine = stack.enter_context(
            _process(_python_module("thunder_mw.benchmarks.fake_engine"), log)
        )
        engine_port = _read_port(engine, log)
        ports = {"direct": (engine_port, engine.pid)}
        if "aiohttp-passthrough" in targets:
            log = workdir / "aiohttp.log"
            cmd = _python_module(
                "thunder_mw.benchmarks.passthrough_proxy",
                "--upstream",
                f"http://{HOST}:{engine_port}",
            )
            proxy = stack.enter_context(_process(cmd, log))
            ports["aiohttp-passthrough"] = (_read_port(proxy, log), proxy.pid)
        for target in (t for t in targets if t in REFERENCE_TARGETS):
            log = workdir / f"{target}.log"
            cmd = _python_module(
                "thunder_mw.benchmarks.asgi_passthrough",
                "--client",
                target.removeprefix("asgi-"),
                "--upstream",
                f"http://{HOST}:{engine_port}",
            )
            proxy = stack.enter_context(_process(cmd, log))
            ports[target] = (_read_port(proxy, log), proxy.pid)
            wait_until_healthy(
                f"http://{HOST}:{ports[target][0]}", timeout_s=30, process=proxy, log_path=log
            )
        if "thunder-mw" in targets:
            config = workdir / "thunder-mw.yaml"
            config.write_text(_gateway_yaml(engine_port))
            port = free_port()
            log = workdir / "thunder-mw.log"
            gateway = stack.enter_context(
                _process(_gateway_command(config, port), log, prints_port=False)
            )
            wait_until_healthy(f"http://{HOST}:{port}", timeout_s=60, process=gateway, log_path=log)
            ports["thunder-mw"] = (port, gateway.pid)
        yield ports


# --- measuring ----------------------------------------------------------------------------


def _probe(port: int) -> dict[str, Any]:
    """One request of each kind, checked for what a client must see through any target."""

    async def both() -> tuple[http_load.Response, http_load.Response]:
        plain = await http_load.fetch(HOST, port, http_request(port, chat_body("p-probe", False)))
        stream = await http_load.fetch(HOST, port, http_request(port, chat_body("p-probe", True)))
        return plain, stream

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        plain, stream = runner.run(both())
    events = [e for e in stream.body.split(b"\n\n") if e.startswith(b"data: ")]
    usage_events = [e for e in events if b'"usage"' in e]
    return {
        "plain_status": plain.status,
        "plain_has_usage": plain.status == 200 and "usage" in json.loads(plain.body),
        "stream_status": stream.status,
        "stream_events": len(events),
        # The client did not ask for usage: a gateway that injects it must hide it again.
        "stream_usage_events": len(usage_events),
        "ok": plain.status == 200
        and stream.status == 200
        and len(events) == STREAM_CHUNKS + 1
        and not usage_events,
    }


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a process (all its threads) so far; None where /proc is absent.

    CPU per request is the figure other load on a shared machine disturbs least: it
    does not count the time the process waited for a core.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    # After the command name: state is field 3, utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _measure_cell(
    port: int,
    pid: int,
    stream: bool,
    concurrency: int,
    tag: str,
    warmup_s: float,
    duration_s: float,
) -> http_load.LoadResult:
    requests = [
        http_request(port, chat_body(f"p-{worker}-{tag}", stream)) for worker in range(concurrency)
    ]
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(
            http_load.closed_loop(
                HOST,
                port,
                requests,
                stream=stream,
                warmup_s=warmup_s,
                duration_s=duration_s,
                server_cpu=lambda: _cpu_seconds(pid),
            )
        )


def _loop_name() -> str:
    loop = new_event_loop()
    loop.close()
    return type(loop).__module__.split(".")[0]


def _summarise(
    cells: dict[tuple[str, bool, int], list[http_load.LoadResult]],
) -> list[dict[str, Any]]:
    rows: dict[tuple[str, bool, int], dict[str, Any]] = {}
    for key, runs in cells.items():
        target, stream, concurrency = key
        rates = [r.req_per_s for r in runs]
        latencies = [x for r in runs for x in r.latencies_s]
        cpu = [r.server_cpu_s for r in runs if r.server_cpu_s is not None]
        cpu_requests = sum(r.requests for r in runs if r.server_cpu_s is not None)
        rows[key] = {
            "target": target,
            "stream": stream,
            "concurrency": concurrency,
            "req_per_s": round(statistics.median(rates), 1),
            "req_per_s_min": round(min(rates), 1),
            "req_per_s_max": round(max(rates), 1),
            "runs": len(runs),
            "requests": sum(r.requests for r in runs),
            "errors": sum(r.errors for r in runs),
            "first_error": next((r.first_error for r in runs if r.first_error), None),
            "latency_p50_ms": round(percentile(latencies, 50) * 1e3, 3) if latencies else math.nan,
            "latency_p99_ms": round(percentile(latencies, 99) * 1e3, 3) if latencies else math.nan,
            # CPU of the target's own process (for direct: the engine) per request.
            "server_cpu_us_per_req": (
                round(sum(cpu) / cpu_requests * 1e6, 1) if cpu and cpu_requests else None
            ),
        }
    for (_target, stream, concurrency), row in rows.items():
        direct = rows.get(("direct", stream, concurrency))
        baseline = rows.get(("aiohttp-passthrough", stream, concurrency))
        for q in ("p50", "p99"):
            row[f"added_{q}_ms"] = (
                round(row[f"latency_{q}_ms"] - direct[f"latency_{q}_ms"], 3) if direct else None
            )
        row["ratio_vs_aiohttp"] = (
            round(row["req_per_s"] / baseline["req_per_s"], 3)
            if baseline and baseline["req_per_s"]
            else None
        )
        # Requests one core serves, relative to the pass-through: noise-resistant req/s ratio.
        row["cpu_ratio_vs_aiohttp"] = (
            round(baseline["server_cpu_us_per_req"] / row["server_cpu_us_per_req"], 3)
            if baseline and baseline["server_cpu_us_per_req"] and row["server_cpu_us_per_req"]
            else None
        )
        row["ratio_vs_direct"] = (
            round(row["req_per_s"] / direct["req_per_s"], 3)
            if direct and direct["req_per_s"]
            else None
        )
    order = {t: i for i, t in enumerate(ALL_TARGETS)}
    return sorted(
        rows.values(), key=lambda r: (r["stream"], r["concurrency"], order.get(r["target"], 99))
    )


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """The results as a fixed-width table, one row per (target, stream, concurrency)."""

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    header = (
        f"{'target':<19} {'stream':<6} {'conc':>4} {'req/s':>6} {'[min - max]':>15} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'+p50':>6} {'+p99':>6} {'ratio':>5} "
        f"{'cpu us/req':>10} {'cpu ratio':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        spread = f"[{r['req_per_s_min']:.0f} - {r['req_per_s_max']:.0f}]"
        lines.append(
            f"{r['target']:<19} {'yes' if r['stream'] else 'no':<6} {r['concurrency']:>4} "
            f"{r['req_per_s']:>6.0f} {spread:>15} {r['latency_p50_ms']:>7.3f} "
            f"{r['latency_p99_ms']:>7.2f} {num(r['added_p50_ms'], '6.3f'):>6} "
            f"{num(r['added_p99_ms'], '6.2f'):>6} {num(r['ratio_vs_aiohttp'], '5.2f'):>5} "
            f"{num(r['server_cpu_us_per_req'], '10.0f'):>10} "
            f"{num(r['cpu_ratio_vs_aiohttp'], '9.2f'):>9}"
            + (f"  errors={r['errors']}" if r["errors"] else "")
        )
    lines.append(
        "req/s: median of runs [min - max]; +p50/+p99: ms added over direct; ratio: req/s over "
        "aiohttp-passthrough's; cpu us/req: CPU of the target's own process per request "
        "(direct: the engine); cpu ratio: aiohttp-passthrough's cpu/req over this one's."
    )
    return "\n".join(lines)


# --- entry points -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's options, for this module's CLI and for `thunder-mw bench`."""
    parser.add_argument("--duration", type=float, default=5.0, help="Measured seconds per run.")
    parser.add_argument("--warmup", type=float, default=1.0, help="Unmeasured seconds first.")
    parser.add_argument("--repeats", type=int, default=3, help="Runs per cell (noise).")
    parser.add_argument(
        "--concurrency",
        default="1,32",
        help="Comma-separated concurrencies (closed-loop workers).",
    )
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help=f"Comma-separated subset of {ALL_TARGETS} (the last three are opt-in references), "
        "or `all`.",
    )
    parser.add_argument(
        "--stream", choices=("both", "no", "yes"), default="both", help="Which modes to run."
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="Result JSON path.")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the scenario as `args` says, write the JSON result file, print the table."""
    targets = list(ALL_TARGETS) if args.targets == "all" else args.targets.split(",")
    unknown = set(targets) - set(ALL_TARGETS)
    if unknown:
        raise ValueError(f"unknown targets {sorted(unknown)}; choose from {ALL_TARGETS}")
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    streams = {"both": [False, True], "no": [False], "yes": [True]}[args.stream]
    cells: dict[tuple[str, bool, int], list[http_load.LoadResult]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="proxy-overhead-") as tmp,
        _servers(targets, Path(tmp)) as servers,
    ):
        probes = {t: _probe(servers[t][0]) for t in targets}
        # Targets interleave inside each repeat so slow drift of the machine hits all alike.
        for repeat in range(args.repeats):
            for stream in streams:
                for concurrency in concurrencies:
                    for target in targets:
                        tag = f"{target}-{int(stream)}-{concurrency}-{repeat}"
                        result = _measure_cell(
                            *servers[target],
                            stream,
                            concurrency,
                            tag,
                            args.warmup,
                            args.duration,
                        )
                        cells.setdefault((target, stream, concurrency), []).append(result)
    results = _summarise(cells)
    report = {
        "scenario": SCENARIO,
        "mode": "live",
        "config": {
            "targets": targets,
            "concurrency": concurrencies,
            "stream": streams,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "repeats": args.repeats,
            "stream_chunks": STREAM_CHUNKS,
            "request_body_bytes": len(chat_body("p-0-x", False)),
            "client_asks_usage": False,
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "event_loop": _loop_name(),
            "latency": "request write to last response byte; pooled over runs",
            "req_per_s": "median over runs, with min and max",
        },
        "probes": probes,
        "results": results,
    }
    output = Path(args.output)
    write_result(output, report)
    print(format_table(results))
    print(f"\nwritten to {output}")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m thunder_mw.benchmarks.proxy_overhead", description=__doc__.splitlines()[0]
    )
    add_arguments(parser)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
