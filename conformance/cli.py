"""`thunder-mw conformance`: its arguments and its entry point (wired in by cli/main.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from thunder_mw.conformance._replay import as_checks, replay, replayable
from thunder_mw.conformance.recording_backend import (
    BackendServer,
    Flavor,
    Recorded,
    RecordingBackend,
)
from thunder_mw.conformance.registry import CHECKS, PROFILE_MEANING, PROFILES, checks_for
from thunder_mw.conformance.report import (
    format_table,
    write_html,
    write_json,
    write_junit,
    write_markdown,
)
from thunder_mw.conformance.runner import SuiteResult, TargetUnavailable, run_conformance_suite
from thunder_mw.middleware.types import Receive, Scope, Send

__all__ = [
    "EXIT_FAILED",
    "EXIT_SETUP",
    "add_conformance_arguments",
    "catalogue",
    "run_conformance",
    "write_records",
]

EXIT_FAILED = 1
EXIT_SETUP = 2


def add_conformance_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check what an agent-context server accepts, strips, rejects and forwards. The suite "
        "starts a recording engine on --backend-port; point the server under test at it."
    )
    parser.add_argument("--target", help="base URL of the server under test")
    parser.add_argument(
        "--backend-port",
        type=int,
        help="port of the recording backend the target forwards to (--self: default free)",
    )
    parser.add_argument(
        "--backend-flavor",
        choices=["vllm", "sglang"],
        default="vllm",
        help="probe routes the recording backend speaks (default vllm)",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default="full",
        help="which promises to check (default full); see --list",
    )
    parser.add_argument(
        "--self",
        dest="self_mode",
        action="store_true",
        help="start thunder-mw itself in front of the recording backend",
    )
    parser.add_argument(
        "--without-context",
        choices=["forward", "reject"],
        default="forward",
        help="the target's documented handling of requests with no agent context",
    )
    parser.add_argument("--check", action="append", metavar="ID", help="run only these checks")
    parser.add_argument("--report", metavar="PATH", help="write the JSON report here")
    parser.add_argument("--junit", metavar="PATH", help="write JUnit XML here")
    parser.add_argument(
        "--report-md",
        metavar="PATH",
        help="write a Markdown report for people (per-profile counts, each failure's payload)",
    )
    parser.add_argument(
        "--report-html", metavar="PATH", help="write the same report as one HTML page"
    )
    parser.add_argument(
        "--record", metavar="PATH", help="write every request the backend received as JSON lines"
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=60.0,
        metavar="S",
        help="how long to wait for the target to answer (default 60)",
    )
    parser.add_argument(
        "--replay-to",
        metavar="URL",
        help="replay the forwarded bodies to this real engine afterwards",
    )
    parser.add_argument(
        "--replay-model",
        metavar="NAME",
        help="model name for the replay (default: the engine's first model)",
    )
    parser.add_argument(
        "--replay-limit",
        type=int,
        default=12,
        metavar="N",
        help="replay at most N bodies, one per check (default 12)",
    )
    parser.add_argument(
        "--serve-backend",
        action="store_true",
        help="only run the recording backend and print what arrives (Ctrl-C ends)",
    )
    parser.add_argument("--list", action="store_true", help="list the checks and profiles")


def run_conformance(args: argparse.Namespace) -> int:
    if args.list:
        sys.stdout.write(catalogue())
        return 0
    if args.serve_backend:
        if args.backend_port is None:
            print("--serve-backend needs --backend-port", file=sys.stderr)
            return EXIT_SETUP
        return _serve_backend(args.backend_port, args.backend_flavor)
    if not args.self_mode and (args.target is None or args.backend_port is None):
        print("give --target URL and --backend-port N (or --self)", file=sys.stderr)
        return EXIT_SETUP
    try:
        result = asyncio.run(_run(args))
    except (TargetUnavailable, ValueError) as exc:
        print(f"conformance: {exc}", file=sys.stderr)
        return EXIT_SETUP
    sys.stdout.write(format_table(result))
    if args.report:
        write_json(result, args.report)
    if args.junit:
        write_junit(result, args.junit)
    if args.report_md:
        write_markdown(result, args.report_md)
    if args.report_html:
        write_html(result, args.report_html)
    if args.record:
        write_records(result.recorded, args.record)
    return EXIT_FAILED if result.failed else 0


async def _run(args: argparse.Namespace) -> SuiteResult:
    result = await run_conformance_suite(
        target=args.target,
        backend_port=args.backend_port,
        profile=args.profile,
        flavor=args.backend_flavor,
        self_mode=args.self_mode,
        without_context=args.without_context,
        only=args.check,
        wait_s=args.wait,
    )
    if args.replay_to:
        chosen = replayable(result.recorded)[: args.replay_limit]
        replayed = await replay(chosen, args.replay_to, model=args.replay_model)
        result.checks.extend(as_checks(replayed, args.replay_to))
    return result


def write_records(records: list[Recorded], path: str | Path) -> None:
    with Path(path).open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")


def catalogue() -> str:
    checks_for("full")  # registers every check
    lines = ["profiles:"]
    lines += [f"  {name:<15} {meaning}" for name, meaning in PROFILE_MEANING.items()]
    lines += ["", "checks (profiles):"]
    for c in CHECKS.values():
        profiles = ",".join(p for p in PROFILES if p in c.profiles)
        lines.append(f"  {c.id:<48} [{profiles}]\n      {c.statement}")
    return "\n".join(lines) + "\n"


class _PrintingBackend(RecordingBackend):
    """The stand-in engine mode: every inference request is printed as it arrives."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        before = len(self.requests)
        await super().__call__(scope, receive, send)
        for record in self.requests[before:]:
            if record.method == "POST":
                print(json.dumps(record.to_dict(), ensure_ascii=False), flush=True)


def _serve_backend(port: int, flavor: Flavor) -> int:
    async def serve() -> None:
        server = BackendServer(_PrintingBackend(flavor), port)
        await server.start()
        print(f"recording backend ({flavor}) on {server.url}; Ctrl-C to stop", file=sys.stderr)
        try:
            await server.wait()
        finally:
            await server.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"conformance: {exc}", file=sys.stderr)
        return EXIT_SETUP
    return 0
