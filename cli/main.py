"""The `thunder-mw` command: serve, check-config, and the tools that ship with the gateway."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from thunder_mw import __version__
from thunder_mw.cli.config_loader import ConfigError, load_config

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
    p.add_argument(
        "--config",
        "-c",
        help="YAML config file (without it: the built-in demo, config/demo.yaml, on two "
        "simulated engines)",
    )
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
    _serve_arguments(
        sub.add_parser("serve", help="run the gateway (the default command; no --config: the demo)")
    )
    check = sub.add_parser("check-config", help="validate a config file and print it normalised")
    check.add_argument("path")
    sub.add_parser("config-reference", help="print the config reference as a markdown table")
    from thunder_mw.cli.plan import add_plan_arguments

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
        from thunder_mw.sim.server import add_sim_engine_arguments
    except ImportError:  # the simulator is optional at import time
        pass
    else:
        add_sim_engine_arguments(sim)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # `thunder-mw --config X` is `thunder-mw serve --config X`; `thunder-mw` is `thunder-mw serve`.
    if not args_list or (
        args_list[0] not in SUBCOMMANDS and args_list[0] not in ("-h", "--help", "--version")
    ):
        args_list.insert(0, "serve")
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.command == "serve":
        from thunder_mw.cli.serve import serve

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
        from thunder_mw.cli.plan import run_plan

        return run_plan(args)
    if args.command == "config-reference":
        from thunder_mw.schemas.config_reference import config_reference

        sys.stdout.write(config_reference())
        return 0
    if args.command == "sim-engine":
        from thunder_mw.sim.server import run_sim_engine

        return run_sim_engine(args)
    parser.print_help()
    return 2


def check_config(path: str) -> int:
    try:
        config = load_config(path)
    except ConfigError as exc:
        return exc.report()
    sys.stdout.write(_yaml_dump(config.model_dump(mode="json")))
    return 0


def _yaml_dump(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


if __name__ == "__main__":
    sys.exit(main())
