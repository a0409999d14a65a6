"""Differential fuzzing: every generated body straight to an engine and through thunder-mw.

Each case of benchmarks/fuzz_bodies.py is sent twice at once: to the engine directly and to a
real `thunder-mw serve` process in front of that same engine. The gateway keeps its contract
on a case when its answer is

- `relayed`: the engine's own 4xx, unchanged (the same status and error object), or
  `relayed_after_stripping`: the engine's own 4xx about another field, where the gateway had
  stripped an agent-context field the engine refused on the direct call, or
- `served_after_stripping`: a 2xx where the engine refused only an agent-context field that
  the gateway reads and strips (what stripping is for), or
- `own_4xx_naming_field`: a 4xx of its own whose error names the field (`param`), or
- `served`: a 2xx where the engine also answered 2xx;

and breaks it with a 5xx, no answer within the bound (`unanswered`), a 4xx of its own naming
no field, an engine 4xx altered on the way, or a 2xx where the engine refused. After the
cases the gateway must still be healthy (GET /health 200) and serve a normal request.

Two engines: the simulator (`thunder-mw sim-engine`, the demo's and every benchmark's engine,
with the tiny model's tokenizer and context length when it is built) and the real vLLM CPU
engine (benchmarks/vllm_cpu.py). `thunder-mw bench --scenario fuzz` runs 10,000 cases on the
first and 1,000 on the second and writes `results/fuzz.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from thunder_mw.benchmarks.fuzz_bodies import FAMILIES, FuzzCase, generate
from thunder_mw.benchmarks.live import Gateway
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.server_process import stop_process, wait_until_healthy
from thunder_mw.sim.ports import free_port

__all__ = [
    "BOUND_S",
    "DEFAULT_OUTPUT",
    "HOST",
    "KEEPS_CONTRACT",
    "STRIPPED_FIELDS",
    "Answer",
    "Tally",
    "add_arguments",
    "fuzz_engine",
    "gateway_config",
    "health_after",
    "main",
    "run_cases",
    "run_sim",
    "run_vllm",
    "send",
    "sim_engine",
    "verdict",
]

DEFAULT_OUTPUT = RESULTS_DIR / "fuzz.json"
HOST = "127.0.0.1"
BOUND_S = 10.0  # every call is answered within this, or counted unanswered
KEEPS_CONTRACT = frozenset(
    {
        "relayed",
        "relayed_after_stripping",
        "own_4xx_naming_field",
        "served",
        "served_after_stripping",
    }
)
# Agent-context fields the gateway consumes and removes from the body it forwards.
STRIPPED_FIELDS = (
    "vllm_xargs.agentic_context",
    "metadata.session_id",
    "program_id",
    "docker_ids",
    "tool_ids",
    "extra_body",
    "nvext",
)
_EXCERPT = 600


@dataclass(frozen=True)
class Answer:
    """One call's outcome: the status (None: no answer within the bound) and the body's head."""

    status: int | None
    body: bytes = b""
    error: str | None = None  # the transport error when there was no answer

    @property
    def klass(self) -> str:
        if self.status is None:
            return "unanswered"
        return f"{self.status // 100}xx"

    def error_object(self) -> dict[str, Any] | None:
        try:
            parsed = json.loads(self.body)
        except ValueError:
            return None
        error = parsed.get("error") if isinstance(parsed, dict) else None
        return error if isinstance(error, dict) else None

    def excerpt(self) -> str:
        text = self.body[:_EXCERPT].decode("utf-8", errors="backslashreplace")
        return text if self.status is not None else f"({self.error})"


def verdict(direct: Answer, gateway: Answer) -> str:
    """How the gateway's answer relates to the engine's for one case (KEEPS_CONTRACT: kept)."""
    if gateway.status is None:
        return "unanswered"
    if gateway.status >= 500:
        return "relayed_engine_5xx" if _same(direct, gateway) else "gateway_5xx"
    if gateway.status < 400:
        if direct.klass == "2xx":
            return "served"
        return "served_after_stripping" if _refused_context(direct) else "served_an_engine_refusal"
    if direct.klass == "4xx" and _same(direct, gateway):
        return "relayed"
    error = gateway.error_object() or {}
    if _is_gateway_error(error):
        return "own_4xx_naming_field" if error.get("param") else "own_4xx_naming_no_field"
    if error and direct.klass == "4xx":
        # The engine's error object, about another field than the direct call's: the gateway
        # stripped an agent-context field the engine refused, and the engine refused the next.
        return "relayed_after_stripping"
    return "engine_4xx_changed"


def _refused_context(direct: Answer) -> bool:
    """Whether the engine refused an agent-context field, which the gateway reads and strips
    before forwarding (vLLM 0.32 types `vllm_xargs` values as scalars, so the vLLM router's
    `agentic_context` object is a 400 there; a null LiteLLM `metadata.session_id` is one on
    /v1/responses)."""
    error = direct.error_object() or {}
    text = f"{error.get('param')} {error.get('message')}"
    return any(f in text for f in STRIPPED_FIELDS)


def _same(direct: Answer, gateway: Answer) -> bool:
    """The engine's own answer: the same status and bytes, or the same engine error (type and
    field; the message may count the agent-context fields the gateway stripped)."""
    if direct.status != gateway.status:
        return False
    if direct.body == gateway.body:
        return True
    mine, relayed = direct.error_object(), gateway.error_object()
    if mine is None or relayed is None or _is_gateway_error(relayed):
        return False
    return all(mine.get(k) == relayed.get(k) for k in ("type", "param", "code"))


def _is_gateway_error(error: dict[str, Any]) -> bool:
    """thunder-mw's errors carry a string `code` (or none); vLLM's carry the HTTP status."""
    return bool(error) and not isinstance(error.get("code"), int)


@dataclass
class Tally:
    """What one engine's run saw."""

    engine: str
    seed: int
    start: int
    count: int
    direct: Counter[str] = field(default_factory=Counter)
    gateway: Counter[str] = field(default_factory=Counter)
    verdicts: Counter[str] = field(default_factory=Counter)
    agree: int = 0
    by_family: dict[str, Counter[str]] = field(default_factory=dict)
    disagreements: list[dict[str, Any]] = field(default_factory=list)
    breaches: list[dict[str, Any]] = field(default_factory=list)
    slowest_s: float = 0.0
    health: dict[str, Any] = field(default_factory=dict)  # health_after's answer
    own_params: Counter[str] = field(default_factory=Counter)  # fields the gateway's 4xx name
    own_where_served: Counter[str] = field(default_factory=Counter)  # ... on a body served direct
    # The simulator's direct answers to the same cases, beside a real engine's (item: the
    # simulator validates like vLLM): classes and the bodies where they differ.
    twin: Counter[str] = field(default_factory=Counter)
    twin_agree: int = 0
    twin_disagreements: list[dict[str, Any]] = field(default_factory=list)

    def add_twin(self, case: FuzzCase, direct: Answer, sim: Answer) -> None:
        self.twin[sim.klass] += 1
        if sim.klass == direct.klass:
            self.twin_agree += 1
            return
        self.twin_disagreements.append(
            {
                **case.summary(),
                "verdict": f"engine {direct.klass}, simulator {sim.klass}",
                "engine": {"status": direct.status, "body": direct.excerpt()},
                "simulator": {"status": sim.status, "body": sim.excerpt()},
            }
        )

    def add(self, case: FuzzCase, direct: Answer, gateway: Answer, elapsed_s: float) -> None:
        self.direct[direct.klass] += 1
        self.gateway[gateway.klass] += 1
        judged = verdict(direct, gateway)
        self.verdicts[judged] += 1
        same_class = direct.klass == gateway.klass
        self.agree += same_class
        self.slowest_s = max(self.slowest_s, elapsed_s)
        if judged.startswith("own_4xx"):
            error = gateway.error_object() or {}
            key = f"{gateway.status} {error.get('code')} {error.get('param')}"
            self.own_params[key] += 1
            if direct.klass == "2xx":  # stricter than the engine: each kind, for the report
                self.own_where_served[key] += 1
        for family in set(case.kinds):
            counts = self.by_family.setdefault(family, Counter())
            counts["cases"] += 1
            counts["same_class"] += same_class
            counts["kept"] += judged in KEEPS_CONTRACT
        record = {
            **case.summary(),
            "verdict": judged,
            "direct": {"status": direct.status, "body": direct.excerpt()},
            "gateway": {"status": gateway.status, "body": gateway.excerpt()},
        }
        if not same_class:
            self.disagreements.append(record)
        if judged not in KEEPS_CONTRACT:
            self.breaches.append(record)

    def report(self, sample: int) -> dict[str, Any]:
        n = sum(self.verdicts.values())
        kept = sum(self.verdicts[v] for v in KEEPS_CONTRACT)
        return {
            "engine": self.engine,
            "seed": self.seed,
            "first_case": self.start,
            "cases": n,
            "direct_status_classes": dict(sorted(self.direct.items())),
            "gateway_status_classes": dict(sorted(self.gateway.items())),
            "gateway_5xx": self.gateway["5xx"],
            "gateway_unanswered": self.gateway["unanswered"],
            "direct_5xx": self.direct["5xx"],
            "direct_unanswered": self.direct["unanswered"],
            "status_class_agreement": round(self.agree / n, 4) if n else None,
            "contract_kept": round(kept / n, 4) if n else None,
            "verdicts": dict(self.verdicts.most_common()),
            "by_family": {f: dict(self.by_family[f]) for f in FAMILIES if f in self.by_family},
            "gateway_own_4xx": dict(self.own_params.most_common()),
            "gateway_own_4xx_where_the_engine_served": dict(self.own_where_served.most_common()),
            "slowest_case_s": round(self.slowest_s, 2),
            "disagreements_total": len(self.disagreements),
            "disagreements_by_verdict": dict(
                Counter(d["verdict"] for d in self.disagreements).most_common()
            ),
            "disagreements_sample": _sample(self.disagreements, sample),
            "contract_breaches_total": len(self.breaches),
            "contract_breaches_sample": _sample(self.breaches, sample),
            **(self._twin_report(n, sample) if self.twin else {}),
        }

    def _twin_report(self, n: int, sample: int) -> dict[str, Any]:
        return {
            "simulator_direct_status_classes": dict(sorted(self.twin.items())),
            "simulator_vs_engine_class_agreement": round(self.twin_agree / n, 4),
            "simulator_vs_engine_disagreements_total": len(self.twin_disagreements),
            "simulator_vs_engine_disagreements_sample": _sample(self.twin_disagreements, sample),
        }


def _sample(records: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """Up to `size` records, spread over the verdicts (each verdict's first ones first)."""
    by_verdict: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_verdict.setdefault(r["verdict"], []).append(r)
    picked: list[dict[str, Any]] = []
    while len(picked) < size and any(by_verdict.values()):
        for rows in by_verdict.values():
            if rows and len(picked) < size:
                picked.append(rows.pop(0))
    return sorted(picked, key=lambda r: r["index"])


async def send(client: httpx.AsyncClient, url: str, case: FuzzCase, bound_s: float) -> Answer:
    headers = [(name.encode(), value) for name, value in case.headers]
    if case.content_type is not None:
        headers.append((b"content-type", case.content_type.encode()))
    try:
        async with asyncio.timeout(bound_s):
            response = await client.post(url + case.route, content=case.body, headers=headers)
    except TimeoutError:
        return Answer(None, error=f"no answer within {bound_s:.0f} s")
    except httpx.HTTPError as exc:
        return Answer(None, error=f"{type(exc).__name__}: {exc}")
    return Answer(response.status_code, response.content[:4096])


async def run_cases(
    tally: Tally,
    cases: list[FuzzCase],
    engine_url: str,
    gateway_url: str,
    *,
    concurrency: int,
    bound_s: float = BOUND_S,
    twin_url: str | None = None,
) -> None:
    """Sends every case to the engine and through the gateway at once, `concurrency` at a time
    (and, with `twin_url`, to a simulated engine beside a real one)."""
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=bound_s * 2, limits=limits, trust_env=False) as client:

        async def one(case: FuzzCase) -> None:
            async with gate:
                t0 = time.monotonic()
                direct, gateway = await asyncio.gather(
                    send(client, engine_url, case, bound_s),
                    send(client, gateway_url, case, bound_s),
                )
                tally.add(case, direct, gateway, time.monotonic() - t0)
                if twin_url is not None:
                    tally.add_twin(case, direct, await send(client, twin_url, case, bound_s))

        await asyncio.gather(*(one(c) for c in cases))


def health_after(gateway_url: str, model: str) -> dict[str, Any]:
    """Whether the gateway is still healthy and serving once the cases are through."""
    with httpx.Client(timeout=BOUND_S * 3, trust_env=False) as client:
        health = client.get(f"{gateway_url}/health")
        normal = client.post(
            f"{gateway_url}/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
    return {
        "health_status": health.status_code,
        "backends_healthy": all(b.get("healthy") for b in health.json().get("backends", [])),
        "normal_request_status": normal.status_code,
    }


def gateway_config(engine_url: str) -> dict[str, Any]:
    """`thunder-mw serve` as a user runs it in front of one engine (default pipeline); Docker
    off, so `docker_ids` are judged by the gateway's own checks on every machine alike."""
    return {
        "server": {"host": HOST, "port": free_port(), "log_level": "warning"},
        "backends": [{"name": "engine", "type": "vllm", "url": engine_url}],
        "tools": {"docker": {"enabled": False}},
    }


def fuzz_engine(
    name: str,
    engine_url: str,
    model: str,
    *,
    seed: int,
    count: int,
    start: int = 0,
    concurrency: int = 8,
    bound_s: float = BOUND_S,
    twin_url: str | None = None,
) -> Tally:
    """One engine's run: a gateway in front of `engine_url`, the cases, the health check."""
    tally = Tally(name, seed, start, count)
    cases = generate(seed, count, model, start=start)
    with Gateway(gateway_config(engine_url)) as gateway:
        asyncio.run(
            run_cases(
                tally,
                cases,
                engine_url,
                gateway.url,
                concurrency=concurrency,
                bound_s=bound_s,
                twin_url=twin_url,
            )
        )
        tally.health = health_after(gateway.url, model)
    return tally


@contextmanager
def sim_engine(model: str, tokenizer_file: Path | None) -> Iterator[str]:
    """`thunder-mw sim-engine` sized like the real engine's run (2,048-token context)."""
    port = free_port()
    args = ["--port", str(port), "--model-name", model, "--max-model-len", "2048"]
    args += ["--num-blocks", "4096", "--time-scale", "1000", "--log-level", "warning"]
    if tokenizer_file is not None:
        args += ["--tokenizer-file", str(tokenizer_file)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "thunder_mw.cli.main", "sim-engine", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://{HOST}:{port}"
        wait_until_healthy(url, timeout_s=60, process=proc)
        yield url
    finally:
        stop_process(proc)


def _tiny_tokenizer() -> Path | None:
    from thunder_mw.benchmarks.vllm_cpu import MODEL_DIR, MODEL_READY_MARKER

    ready = (MODEL_DIR / MODEL_READY_MARKER).is_file()
    return MODEL_DIR / "tokenizer.json" if ready else None


def run_sim(args: argparse.Namespace) -> dict[str, Any]:
    from thunder_mw.benchmarks.vllm_cpu import SERVED_MODEL_NAME

    tokenizer = _tiny_tokenizer()
    with sim_engine(SERVED_MODEL_NAME, tokenizer) as url:
        tally = fuzz_engine(
            "sim",
            url,
            SERVED_MODEL_NAME,
            seed=args.seed,
            count=args.sim_cases,
            concurrency=args.concurrency,
            bound_s=args.bound_s,
        )
    result = _finish(tally, args)
    result["engine_setup"] = (
        "thunder-mw sim-engine, max_model_len 2048, 4,096 blocks of 16 tokens, time scale 1000, "
        + ("the tiny model's tokenizer" if tokenizer else "its rule tokenizer")
    )
    return result


def run_vllm(args: argparse.Namespace) -> dict[str, Any]:
    from thunder_mw.benchmarks.vllm_cpu import start_vllm

    with (
        start_vllm(num_blocks=None, startup_timeout_s=400) as engine,
        sim_engine(engine.model, engine.tokenizer_json) as twin,
    ):
        tally = fuzz_engine(
            "vllm",
            engine.url,
            engine.model,
            seed=args.seed + 1,
            count=args.vllm_cases,
            concurrency=max(1, args.concurrency // 2),
            bound_s=args.bound_s,
            twin_url=twin,
        )
        setup = (
            f"vLLM CPU engine (vllm-cpu, tiny model, max_model_len 2048, "
            f"{engine.num_blocks} blocks of {engine.block_size} tokens)"
        )
    result = _finish(tally, args)
    result["engine_setup"] = setup
    return result


def _finish(tally: Tally, args: argparse.Namespace) -> dict[str, Any]:
    result = tally.report(args.sample)
    result["health_after"] = tally.health
    print(
        f"{tally.engine}: {result['cases']} cases, gateway 5xx {result['gateway_5xx']}, "
        f"unanswered {result['gateway_unanswered']}, class agreement "
        f"{result['status_class_agreement']}, contract kept {result['contract_kept']}, "
        f"health after {result['health_after']}",
        file=sys.stderr,
    )
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", default="sim,vllm", help="sim, vllm, or both")
    parser.add_argument("--sim-cases", type=int, default=10_000)
    parser.add_argument("--vllm-cases", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--bound-s", type=float, default=BOUND_S)
    parser.add_argument("--sample", type=int, default=40, help="disagreements kept per engine")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or set(parts) - {"sim", "vllm"}:
        parser.error(f"--parts: sim and/or vllm, not {args.parts!r}")
    t0 = time.monotonic()
    engines: dict[str, Any] = {}
    if "sim" in parts:
        engines["sim"] = run_sim(args)
    if "vllm" in parts:
        engines["vllm"] = run_vllm(args)
    total = sum(e["cases"] for e in engines.values())
    report: dict[str, Any] = {
        "benchmark": "fuzz",
        "command": shlex.join(["python", "-m", "thunder_mw.benchmarks.fuzz", *(argv or [])]),
        "contract": "gateway answer = the engine's 4xx relayed unchanged, or a 4xx of its own "
        "naming the field (`param`), or 2xx where the engine served; never 5xx, every call "
        f"answered within {args.bound_s:.0f} s; GET /health and a normal request afterwards",
        "seeds": {name: e["seed"] for name, e in engines.items()},
        "total": {
            "cases": total,
            "gateway_5xx": sum(e["gateway_5xx"] for e in engines.values()),
            "gateway_unanswered": sum(e["gateway_unanswered"] for e in engines.values()),
            "contract_breaches": sum(e["contract_breaches_total"] for e in engines.values()),
        },
        "engines": engines,
        "config": {
            "concurrency": args.concurrency,
            "bound_s": args.bound_s,
            "gateway": "thunder-mw serve, default pipeline, tools.docker.enabled false",
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "wall_s": round(time.monotonic() - t0, 1),
    }
    write_result(args.output, report, indent=1)
    print(json.dumps(report["total"]))
    healthy = all(
        e["health_after"]["health_status"] == 200 and e["health_after"]["normal_request_status"]
        == 200 for e in engines.values()
    )  # fmt: skip
    clean = report["total"]["gateway_5xx"] == 0 and report["total"]["gateway_unanswered"] == 0
    return 0 if clean and healthy else 1


if __name__ == "__main__":
    sys.exit(main())
