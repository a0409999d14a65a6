"""Every third-party import of the package is declared: at module level in the product's
subpackages a `[project].dependencies` entry (so `pip install thunder-mw` serves), in a
function body or a module that only an extra's users import, that extra. A fresh install
once crashed on an import the test environment happened to have (numpy, through the CLI)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PRODUCT = (
    "schemas",
    "policies",
    "engines",
    "tools",
    "observability",
    "state",
    "middleware",
    "sim",
    "cli",
    "conformance",
)
# Modules imported only by users of an extra, with the extra whose packages they may import
# at module level (besides the declared dependencies).
EXTRA_MODULES = {"middleware/litellm_hook.py": "agents"}
# Benchmarks: imported by `thunder-mw bench` / `replay`, which work on the declared
# dependencies and name the `bench` extra for the rest.
BENCH = "benchmarks"


def _dist_name(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


DECLARED = {_dist_name(r) for r in PYPROJECT["project"]["dependencies"]}
EXTRAS = {
    extra: {_dist_name(r) for r in reqs}
    for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items()
}
# Import name -> the distributions that provide it, from what is installed here.
PROVIDERS = {
    name: {_dist_name(d) for d in dists} for name, dists in packages_distributions().items()
}


def _imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """(top-level module, whether the import runs when the module is imported)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, at_import: bool) -> None:
        for child in ast.iter_child_nodes(node):
            lazy = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # never runs
            if isinstance(child, ast.Try) and _catches_import_error(child):
                for rest in (*child.handlers, *child.orelse, *child.finalbody):
                    visit(rest, at_import)
                continue  # `try: import x / except ImportError`: optional by construction
            if isinstance(child, ast.Import):
                found.extend((a.name.partition(".")[0], at_import) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module.partition(".")[0], at_import))
            visit(child, at_import and not lazy)

    visit(tree, True)
    return found


def _catches_import_error(node: ast.Try) -> bool:
    caught = " ".join(ast.unparse(h.type) for h in node.handlers if h.type is not None)
    return "ImportError" in caught or "ModuleNotFoundError" in caught


def _third_party(name: str) -> bool:
    return name not in sys.stdlib_module_names and name not in ("thunder_mw", "__future__")


def _undeclared(folders: tuple[str, ...], base_extra: str | None) -> list[str]:
    every_extra = set().union(*EXTRAS.values())
    problems = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            extra = EXTRA_MODULES.get(rel, base_extra)
            allowed_now = DECLARED | (EXTRAS[extra] if extra else set())
            for name, at_import in _imports(ast.parse(path.read_text())):
                if not _third_party(name):
                    continue
                providers = PROVIDERS.get(name)
                assert providers, f"{rel} imports {name!r}, which no installed package provides"
                allowed = allowed_now if at_import else allowed_now | every_extra
                if not providers & allowed:
                    when = "on import" if at_import else "in a function"
                    problems.append(f"{rel}: {name} ({when}; from {sorted(providers)})")
    return problems


def test_the_products_imports_are_declared_dependencies() -> None:
    assert _undeclared(PRODUCT, None) == []


def test_the_benchmark_harness_imports_only_declared_or_bench_packages_on_import() -> None:
    assert _undeclared((BENCH,), "bench") == []


def test_the_check_sees_an_undeclared_import(tmp_path: Path) -> None:
    # The walk finds module-level and function-level imports, and skips TYPE_CHECKING blocks.
    tree = ast.parse(
        "import numpy as np\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import matplotlib\n"
        "def f():\n    from tokenizers import Tokenizer\n"
        "try:\n    import uvloop\nexcept ImportError:\n    import asyncio\n"
    )
    assert _imports(tree) == [
        ("numpy", True),
        ("typing", True),
        ("tokenizers", False),
        ("asyncio", True),
    ]
    assert "numpy" in PROVIDERS and not PROVIDERS["numpy"] & DECLARED
