"""The `thunder-mw` command: serve, check-config, and the tools that ship with the gateway."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn
from thunder_mw import __version__
from thunder_mw.middleware.config_loader import ConfigError, load_config

log = logging.getLogger("thunder_mw")
SUBCOMMANDS = (
    "serve",
    "check-config",
    "config-reference",
    "plan",
    "conformance",
    "bench",
    "replay",
    "sim-engine",
)


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="YAML config file")
    p.add_argument("--host", help="override server.host")
    p.add_argument("--port", type=int, help="override server.port")
    p.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        help="override server.log_level",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thunder-mw", description="Program-aware scheduling gateway for LLM agents."
    )
    parser.add_argument("--version", action="version", version=f"thunder-mw {__version__}")
    sub = parser.add_subparsers(dest="command")
    _serve_arguments(sub.add_parser("serve", help="run the gateway (the default command)"))
    check = sub.add_parser("check-config", help="validate a config file and print it normalised")
    check.add_argument("path")
    sub.add_parser("config-reference", help="print the config reference as a markdown table")
    from thunder_mw.middleware.plan_cli import add_plan_arguments

    add_plan_arguments(sub.add_parser("plan", help="KV capacity plan: how many programs fit"))
    from thunder_mw.conformance.cli import add_conformance_arguments

    add_conformance_arguments(
        sub.add_parser("conformance", help="check an agent-context server's field handling")
    )
    from thunder_mw.benchmarks.bench_cli import add_bench_arguments

    add_bench_arguments(sub.add_parser("bench", help="run a benchmark scenario"))
    from thunder_mw.benchmarks.replay_cli import add_replay_arguments

    add_replay_arguments(
        sub.add_parser("replay", help="drive agent programs through any OpenAI-compatible URL")
    )
    sim = sub.add_parser("sim-engine", help="serve a simulated vLLM/SGLang engine")
    try:
        from thunder_mw.benchmarks.sim.server import add_sim_engine_arguments
    except ImportError:  # the simulator is optional at import time
        pass
    else:
        add_sim_engine_arguments(sim)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # `thunder-mw --config X` is `thunder-mw serve --config X`.
    if (
        args_list
        and args_list[0] not in SUBCOMMANDS
        and args_list[0] not in ("-h", "--help", "--version")
    ):
        args_list.insert(0, "serve")
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.command == "serve":
        return serve(args)
    if args.command == "check-config":
        return check_config(args.path)
    if args.command == "conformance":
        from thunder_mw.conformance.cli import run_conformance

        return run_conformance(args)
    if args.command == "bench":
        from thunder_mw.benchmarks.bench_cli import run_bench

        return run_bench(args)
    if args.command == "replay":
        from thunder_mw.benchmarks.replay_cli import run_replay

        return run_replay(args)
    if args.command == "plan":
        from thunder_mw.middleware.plan_cli import run_plan

        return run_plan(args)
    if args.command == "config-reference":
        from thunder_mw.schemas.config_reference import config_reference

        sys.stdout.write(config_reference())
        return 0
    if args.command == "sim-engine":
        from thunder_mw.benchmarks.sim.server import run_sim_engine

        return run_sim_engine(args)
    parser.print_help()
    return 2


def check_config(path: str) -> int:
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(f"{exc.path}: invalid configuration", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    sys.stdout.write(_yaml_dump(config.model_dump(mode="json")))
    return 0


def _yaml_dump(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def serve(args: argparse.Namespace) -> int:
    from thunder_mw.middleware.app import create_app

    overrides: dict[str, Any] = {}
    for key in ("host", "port", "log_level"):
        if getattr(args, key, None) is not None:
            overrides.setdefault("server", {})[key] = getattr(args, key)
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"{exc.path}: invalid configuration", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    from thunder_mw.middleware.bounded_head import bounded_httptools, raw_head_limit
    from thunder_mw.middleware.log_format import configure_logging
    from thunder_mw.middleware.redaction import config_secrets
    from thunder_mw.middleware.redaction import install as install_redaction

    level = config.server.log_level
    configure_logging(level, config.observability.log_format)
    app = create_app(config)
    server_config = uvicorn.Config(
        app,
        host=config.server.host,
        port=config.server.port,
        log_level=level,
        loop="uvloop",
        http=bounded_httptools(
            raw_head_limit(config.server.max_header_bytes, config.server.max_headers)
        ),
        lifespan="on",
        access_log=config.observability.access_log,
        # JSON logs: uvicorn's own loggers go through the same root handler.
        **({"log_config": None} if config.observability.log_format == "json" else {}),
        proxy_headers=False,
        server_header=False,
        # Idle client connections outlive the clients' own pools, so clients close them first.
        timeout_keep_alive=config.server.keep_alive_s,
        timeout_graceful_shutdown=30,
    )
    # uvicorn.Config has just installed its loggers' handlers: every handler gets the filter.
    install_redaction(config_secrets(config))
    server = _GatewayServer(app, server_config)
    server.run()
    return 0 if server.started else 1


class _GatewayServer(uvicorn.Server):
    """uvicorn, plus: on SIGTERM/SIGINT held requests are answered with 503 at once, while
    streams already running get uvicorn's graceful-shutdown deadline to finish."""

    def __init__(self, app: Any, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._gateway = app

    def handle_exit(self, sig: int, frame: Any) -> None:
        loop = self._loop
        if loop is not None and not self.should_exit:
            loop.call_soon_threadsafe(self._gateway.core.scheduler.drain)
        super().handle_exit(sig, frame)

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    _loop: asyncio.AbstractEventLoop | None = None


if __name__ == "__main__":
    sys.exit(main())
