"""The `thunder-mw` command: serve, check-config, and the tools that ship with the gateway."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from thunder_mw._version import __version__
from thunder_mw.cli.config_loader import ConfigError, load_config

__all__ = [
    "EXTRA_IMPORTS",
    "SUBCOMMANDS",
    "SUBCOMMAND_TABLE",
    "MissingExtra",
    "Subcommand",
    "build_parser",
    "check_config",
    "check_config_arguments",
    "main",
    "run_check_config",
    "run_config_reference",
    "run_serve",
    "serve_arguments",
]

log = logging.getLogger("thunder_mw")


@dataclass(frozen=True)
class Subcommand:
    """One subcommand, loaded only when named: its module is imported by `thunder-mw NAME`
    (or `--help`), never by another, so serving needs only the declared dependencies and a
    tool whose extra is missing fails alone, with the extra named."""

    help: str
    module: str  # the module holding `add_arguments` and `run` (both by these names below)
    add_arguments: str | None
    run: str


SUBCOMMAND_TABLE: dict[str, Subcommand] = {
    "serve": Subcommand(
        "run the gateway (the default command; no --config: the demo)",
        "thunder_mw.cli.main",
        "serve_arguments",
        "run_serve",
    ),
    "check-config": Subcommand(
        "validate a config file and print it normalised",
        "thunder_mw.cli.main",
        "check_config_arguments",
        "run_check_config",
    ),
    "config-reference": Subcommand(
        "print the config reference as a markdown table",
        "thunder_mw.cli.main",
        None,
        "run_config_reference",
    ),
    "plan": Subcommand(
        "KV capacity plan: how many programs fit",
        "thunder_mw.cli.plan",
        "add_plan_arguments",
        "run_plan",
    ),
    "conformance": Subcommand(
        "check an agent-context server's field handling",
        "thunder_mw.conformance.cli",
        "add_conformance_arguments",
        "run_conformance",
    ),
    "bench": Subcommand(
        "run a benchmark scenario",
        "thunder_mw.benchmarks.bench_cli",
        "add_bench_arguments",
        "run_bench",
    ),
    "replay": Subcommand(
        "drive agent programs through any OpenAI-compatible URL",
        "thunder_mw.benchmarks.replay_cli",
        "add_replay_arguments",
        "run_replay",
    ),
    "sim-engine": Subcommand(
        "serve a simulated vLLM/SGLang engine",
        "thunder_mw.sim.server",
        "add_sim_engine_arguments",
        "run_sim_engine",
    ),
}
SUBCOMMANDS = tuple(SUBCOMMAND_TABLE)

# The optional dependencies each extra brings (pyproject.toml's [project.optional-dependencies]),
# by import name: a subcommand that meets one of these missing names the extra to install.
EXTRA_IMPORTS: dict[str, str] = {
    "numpy": "bench",
    "matplotlib": "bench",
    "tokenizers": "bench",
    "litellm": "agents",
    "minisweagent": "agents",
}


class MissingExtra(Exception):
    """A subcommand needs an optional dependency that is not installed."""

    def __init__(self, command: str, missing: str, extra: str) -> None:
        super().__init__(
            f"thunder-mw {command} needs {missing!r}, which comes with the {extra!r} extra: "
            f"pip install 'thunder-mw[{extra}]'"
        )


def _missing_extra(command: str, exc: ModuleNotFoundError) -> MissingExtra | None:
    top = (exc.name or "").partition(".")[0]
    extra = EXTRA_IMPORTS.get(top)
    return None if extra is None else MissingExtra(command, top, extra)


def _attribute(command: str, name: str) -> Any:
    spec = SUBCOMMAND_TABLE[command]
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError as exc:
        raise _missing_extra(command, exc) or exc from None
    return getattr(module, name)


def serve_arguments(p: argparse.ArgumentParser) -> None:
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


def check_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path")


def run_serve(args: argparse.Namespace) -> int:
    from thunder_mw.cli.serve import serve

    return serve(args)


def run_check_config(args: argparse.Namespace) -> int:
    return check_config(args.path)


def run_config_reference(args: argparse.Namespace) -> int:
    from thunder_mw.schemas.config_reference import config_reference

    sys.stdout.write(config_reference())
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of `thunder-mw`, with the options of `command` only (every subcommand is
    listed; the others' options load when they are named). None: every subcommand's options,
    for tests and the reference that need the whole tree."""
    parser = argparse.ArgumentParser(
        prog="thunder-mw", description="Program-aware scheduling gateway for LLM agents."
    )
    parser.add_argument("--version", action="version", version=f"thunder-mw {__version__}")
    sub = parser.add_subparsers(dest="command")
    for name, spec in SUBCOMMAND_TABLE.items():
        p = sub.add_parser(name, help=spec.help)
        if spec.add_arguments is not None and command in (None, name):
            _attribute(name, spec.add_arguments)(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # `thunder-mw --config X` is `thunder-mw serve --config X`; `thunder-mw` is `thunder-mw serve`.
    if not args_list or (
        args_list[0] not in SUBCOMMANDS and args_list[0] not in ("-h", "--help", "--version")
    ):
        args_list.insert(0, "serve")
    command = args_list[0] if args_list[0] in SUBCOMMANDS else ""
    try:
        parser = build_parser(command)
        args = parser.parse_args(args_list)
        if args.command is None:
            parser.print_help()
            return 2
        try:
            code: int = _attribute(args.command, SUBCOMMAND_TABLE[args.command].run)(args)
        except ModuleNotFoundError as exc:
            # An optional dependency imported only once the command runs (a plot, a fit).
            raise _missing_extra(args.command, exc) or exc from None
    except MissingExtra as exc:
        sys.stderr.write(f"thunder-mw: {exc}\n")
        return 2
    return code


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
