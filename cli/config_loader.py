"""Reads the YAML config (env overrides on top); reports errors with their YAML location."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from thunder_mw.engines.capacity import planned_capacity
from thunder_mw.policies.capacity_plan import PlanError
from thunder_mw.policies.pipeline import custom_stage_problems
from thunder_mw.schemas.config import ThunderConfig
from thunder_mw.schemas.stage_settings import entry_error

__all__ = ["ConfigError", "load_config", "location"]


class ConfigError(Exception):
    """Every problem in a config file, each as `location: message`."""

    def __init__(self, path: str, problems: list[str]) -> None:
        super().__init__(f"{path}: " + "; ".join(problems))
        self.path = path
        self.problems = problems

    def report(self) -> int:
        """Prints the problems to stderr, one a line; returns the commands' exit status 2."""
        print(f"{self.path}: invalid configuration", file=sys.stderr)
        for problem in self.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ThunderConfig:
    """The config in `path`, then THUNDER_MW_* environment variables, then `overrides`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from None
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not valid YAML: {exc}"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), ["the top level must be a mapping of sections"])
    try:
        config = ThunderConfig(**data)
    except ValidationError as exc:
        raise ConfigError(str(path), [_describe(err, root) for err in exc.errors()]) from None
    plan_problems = []
    for i, backend in enumerate(config.backends):
        if backend.plan is not None:
            try:
                planned_capacity(backend.plan)
            except PlanError as exc:
                plan_problems.append(_locate(f"backends[{i}].plan: {exc}", root))
    if plan_problems:
        raise ConfigError(str(path), plan_problems)
    # Built-in stages were validated with the rest; a third-party one by its own class.
    stage_problems = custom_stage_problems(config.policies)
    if stage_problems:
        raise ConfigError(str(path), [_locate(p, root) for p in stage_problems]) from None
    if overrides:
        try:
            config = ThunderConfig.model_validate(_deep_merge(config.model_dump(), overrides))
        except ValidationError as exc:
            raise ConfigError("command line", [_describe(e, None) for e in exc.errors()]) from None
    return config


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def location(loc: tuple[Any, ...]) -> str:
    """('backends', 1, 'url') -> 'backends[1].url'"""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _describe(err: Any, root: yaml.Node | None) -> str:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    if loc[:1] == ("policies",) and len(loc) > 1:
        # An entry of the pipeline: `policies[i].stage.param: message` (schemas/stage_settings.py).
        entry, message = entry_error({**err, "loc": loc[1:]})
        loc = ("policies", *entry)
        line = _line_of(root, loc) if root is not None else None
        return location(loc) + (f" (line {line})" if line else "") + f": {message}"
    # A section's own check that is about one of its fields names it (`ctx.field`).
    field = (err.get("ctx") or {}).get("field")
    if isinstance(field, str):
        loc += (field,)
    line = _line_of(root, loc) if root is not None else None
    where = location(loc) + (f" (line {line})" if line else "")
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        message = "unknown key"
    return f"{where}: {message}"


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the deepest YAML node that the error location reaches."""
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if key.value == part:
                    line = key.start_mark.line + 1
                    node = value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return line
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _locate(problem: str, root: yaml.Node | None) -> str:
    """Adds the YAML line to a `policies[i].stage.param: message` problem."""
    where, _, message = problem.partition(": ")
    loc: list[Any] = []
    for part in where.replace("[", ".[").split("."):
        if part.startswith("[") and part.endswith("]"):
            loc.append(int(part[1:-1]))
        elif part:
            loc.append(part)
    line = _line_of(root, tuple(loc))
    return f"{where} (line {line}): {message}" if line else problem
