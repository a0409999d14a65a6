"""The dependency rule of docs/architecture.md, checked on every module's imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from thunder_mw.policies.core import SchedulerCore

ROOT = Path(__file__).resolve().parents[2]
# The layers under the CLI, data to middleware.
_BELOW_CLI = frozenset(
    {"schemas", "policies", "sim", "engines", "tools", "observability", "state", "middleware"}
)
# What each top-level folder may import of thunder_mw (besides itself).
ALLOWED: dict[str, frozenset[str]] = {
    "schemas": frozenset(),
    "policies": frozenset({"schemas"}),
    "sim": frozenset({"schemas", "policies"}),
    "engines": frozenset({"schemas", "policies", "sim"}),
    "tools": frozenset({"schemas", "policies"}),
    # The shared state store (Redis) under the live scheduler: an I/O component.
    "state": frozenset({"schemas", "policies"}),
    "observability": frozenset({"schemas", "policies", "engines"}),
    "middleware": frozenset({"schemas", "policies", "engines", "tools", "observability", "state"}),
    # The CLI assembles everything; the conformance suite drives a gateway the CLI builds.
    "cli": _BELOW_CLI | {"conformance", "benchmarks"},
    "conformance": _BELOW_CLI | {"cli"},
    # The harness (shipped: `thunder-mw bench`, `replay`) drives the core and the simulated
    # engines in process; a gateway it measures live runs in its own process.
    "benchmarks": frozenset({"schemas", "policies", "sim", "engines"}),
    # One-off measurements, not in the wheel: the layer above everything, the harness too;
    # in no other layer's list, so nothing shipped may import it.
    "lab": _BELOW_CLI | {"cli", "benchmarks", "conformance"},
}
# The package's own `__init__` exports gateway mode's names, lazily.
TOP_LEVEL = frozenset(ALLOWED)


def _imports(path: Path) -> set[str]:
    """The thunder_mw subpackages a module imports (at any depth, lazily or not)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "thunder_mw" and len(parts) > 1 and parts[1] in TOP_LEVEL:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_a_folder_imports_only_the_layers_below_it(folder: str) -> None:
    wrong = {
        f"{path.relative_to(ROOT)} imports thunder_mw.{other}"
        for path in (ROOT / folder).rglob("*.py")
        for other in _imports(path) - ALLOWED[folder] - {folder}
    }
    assert not wrong, sorted(wrong)


def test_no_layer_imports_the_package_root() -> None:
    # The root's `__init__` re-exports gateway mode's names from the layers; a layer that
    # imported the root would import upward (the version lives in `_version.py`).
    wrong = sorted(
        str(path.relative_to(ROOT))
        for folder in ALLOWED
        for path in (ROOT / folder).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == "thunder_mw" and node.level == 0
    )
    assert not wrong


def test_the_shipped_harness_never_imports_the_lab() -> None:
    # benchmarks/ ships in the wheel (`thunder-mw bench`, `replay`); lab/ does not.
    wrong = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "benchmarks").rglob("*.py")
        if "lab" in _imports(path)
    )
    assert not wrong


def test_the_checker_sees_a_wrong_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from thunder_mw.benchmarks.des import simulate\n")
    assert _imports(module) == {"benchmarks"}


def _third_party(path: Path) -> set[str]:
    """The top-level names of the packages a module imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
    return found


# The gateway talks to engines on one HTTP client stack, aiohttp's (engines/client.py):
# httpx is for the client-side tools beside it (conformance, benchmarks) and for tests.
# (The Docker SDK's requests, in tools/, talks to the Docker daemon, not to engines.)
_GATEWAY = sorted(_BELOW_CLI | {"cli"})


@pytest.mark.parametrize("folder", _GATEWAY)
def test_the_gateway_has_one_http_client_stack(folder: str) -> None:
    wrong = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in (ROOT / folder).rglob("*.py")
        for name in _third_party(path) & {"httpx", "httpx_aiohttp"}
    }
    assert not wrong, sorted(wrong)


def _policy_imports(path: Path, modules: frozenset[str]) -> set[str]:
    """The policies/ modules a module of policies/ imports (at any depth, lazily or not)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[:2] != ["thunder_mw", "policies"]:
                continue
            if len(parts) > 2:
                found.add(parts[2])
            else:  # `from thunder_mw.policies import x`: a module, else the package's names
                named = {alias.name for alias in node.names}
                found |= (named & modules) or {"__init__"}
                if named - modules:
                    found.add("__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[:2] == ["thunder_mw", "policies"]:
                    found.add(parts[2] if len(parts) > 2 else "__init__")
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle in `graph` (module -> modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_import_cycle_among_the_policies_modules() -> None:
    folder = ROOT / "policies"
    modules = frozenset(p.stem for p in folder.glob("*.py"))
    graph = {p.stem: _policy_imports(p, modules) - {p.stem} for p in folder.glob("*.py")}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_checker_sees_a_cycle() -> None:
    assert _cycle({"core": {"stages"}, "stages": {"core"}}) == ["core", "stages", "core"]
    assert _cycle({"core": {"stages"}, "stages": set()}) is None


def _module_name(path: Path) -> str:
    parts = ["thunder_mw", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _source_imports(source: str, here: str, package: str, modules: frozenset[str]) -> set[str]:
    """The modules of `modules` that module `here` (in `package`) imports anywhere: at
    module level, under `if TYPE_CHECKING:` and in function bodies alike. A cycle hidden in
    a function or behind TYPE_CHECKING is still two modules that need each other; counting
    every import keeps each one a layer of its own."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        # `from a.b import c` needs a.b (and c, where c is a module). The parent packages
        # an import also runs are left out: a package's `__init__` importing its own
        # modules is the ordinary shape, not a cycle.
        found |= {target for target in targets if target in modules}
    return found - {here}


def _module_imports(path: Path, modules: frozenset[str]) -> set[str]:
    """The thunder_mw modules a module of the package imports, anywhere in it."""
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    return _source_imports(path.read_text(), here, package, modules)


def _package_import_graph() -> dict[str, set[str]]:
    # The package's own folders and root modules only: a checkout also holds caches and
    # virtual environments (.cache/vllm-venv in CI) whose files are not the package's.
    paths = [*ROOT.glob("*.py"), *(p for f in sorted(TOP_LEVEL) for p in (ROOT / f).rglob("*.py"))]
    modules = frozenset(_module_name(p) for p in paths)
    return {_module_name(p): _module_imports(p, modules) for p in paths}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of modules that import each other (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def test_no_import_cycle_in_the_package() -> None:
    assert _cycles(_package_import_graph()) == []


def test_the_import_graph_counts_type_checking_and_function_body_imports() -> None:
    modules = frozenset({"pkg.a", "pkg.b", "pkg.c"})
    hidden = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
    lazy = "def f():\n    from pkg import c\n    from . import a\n"
    assert _source_imports(hidden, "pkg.a", "pkg", modules) == {"pkg.b"}
    assert _source_imports(lazy, "pkg.b", "pkg", modules) == {"pkg.a", "pkg.c"}
    graph = {
        "pkg.a": _source_imports(hidden, "pkg.a", "pkg", modules),
        "pkg.b": _source_imports(lazy, "pkg.b", "pkg", modules),
    }
    assert _cycles(graph) == [["pkg.a", "pkg.b"]]


def test_the_module_cycle_finder_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# The core's state and its event methods, which nothing outside policies/ may reach: the
# middleware, the harnesses and the lab speak to the core through `handle(event)` and read it
# through its queries (`snapshot`, `programs_on`, `counts`, `pipeline`, `backend_views`: the
# engines read-only, never the live `backends`...). A receiver is the
# core when its last name is `core` (`core`, `self.core`, `scheduler.core`): every holder of
# one names it so, and other objects may keep fields of these names (a DES result's
# `counters`).
_CORE_INTERNALS = frozenset(
    {
        "table",
        "backends",
        "counters",
        "stages",
        "_apply",
        "_run",
        "apply",
        "on_request",
        "on_finished",
        "on_abandoned",
        "on_hold_expired",
        "on_release",
        "on_tick",
        "on_adopted",
        "on_taken_over",
        "on_backend",
        "on_foreign_reservations",
        "add_backend",
        "drain_backend",
        "remove_backend",
        "declare_host_tier",
        "mark_cache_cold",
        "reroute",
    }
)
# The core's queries that answer with its live programs, for its stages: outside policies/
# a program is read as a frozen snapshot (`snapshot`, `snapshots`), which later events
# never change (docs/architecture.md, "The core's boundary").
_LIVE_PROGRAM_QUERIES = frozenset(
    {"program", "programs", "next_victim", "next_idle", "next_overdue"}
)
_OUTSIDE_POLICIES = sorted(set(TOP_LEVEL) - {"policies"})


def _reaches_into_the_core(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr not in _CORE_INTERNALS and node.attr not in _LIVE_PROGRAM_QUERIES:
            continue
        receiver = node.value
        name = receiver.id if isinstance(receiver, ast.Name) else None
        if isinstance(receiver, ast.Attribute):
            name = receiver.attr
        if name == "core":
            found.append(f"line {node.lineno}: core.{node.attr}")
        elif node.attr == "_apply" and name != "self":
            found.append(f"line {node.lineno}: another object's private _apply")
    return found


def test_nothing_outside_policies_reaches_into_the_core() -> None:
    wrong = [
        f"{path.relative_to(ROOT)} {hit}"
        for folder in _OUTSIDE_POLICIES
        for path in (ROOT / folder).rglob("*.py")
        for hit in _reaches_into_the_core(path.read_text())
    ]
    assert not wrong, wrong


# The core's event methods, private behind `handle(event)`: their names as the core has them
# (`_on_request`...) and as they were public (`on_request`...).
_EVENT_METHODS = frozenset(
    name for cls in SchedulerCore.__mro__ for name in vars(cls) if name.startswith("_on_")
)
_FORMER_EVENT_METHODS = frozenset(name[1:] for name in _EVENT_METHODS)


def _calls_an_event_method(source: str) -> list[str]:
    """Where a module reaches a core event method instead of `handle(event)`: a private one on
    any object but `self` (a harness's own `self._on_tick` is its own), or one of their
    public names on the core (a stage's public `on_request` hook is not the core's)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        receiver = node.value
        name = receiver.id if isinstance(receiver, ast.Name) else None
        if isinstance(receiver, ast.Attribute):
            name = receiver.attr
        if node.attr in _EVENT_METHODS and name not in ("self", "cls"):
            found.append(f"line {node.lineno}: {node.attr}")
        elif node.attr in _FORMER_EVENT_METHODS and name == "core":
            found.append(f"line {node.lineno}: core.{node.attr}")
    return found


def test_only_handle_reaches_the_core_event_methods_from_outside_policies() -> None:
    # The tests too: they speak to the core as the gateway and the harnesses do.
    wrong = [
        f"{path.relative_to(ROOT)} {hit}"
        for folder in (*_OUTSIDE_POLICIES, "tests")
        for path in (ROOT / folder).rglob("*.py")
        for hit in _calls_an_event_method(path.read_text())
    ]
    assert not wrong, wrong


def test_the_event_method_checker_sees_a_call_past_handle() -> None:
    assert _EVENT_METHODS >= {"_on_request", "_on_finished", "_on_tick", "_on_backend"}
    assert _calls_an_event_method("core._on_request(ctx, info, now)\n")
    assert _calls_an_event_method("sim.core._on_backend('b0', now=1.0)\n")
    assert _calls_an_event_method("a._on_tick(5.0)\n")
    assert _calls_an_event_method("decision, _ = core.on_request(ctx, info, now)\n")
    assert _calls_an_event_method("scheduler.core.on_tick(now)\n")
    assert not _calls_an_event_method("out = core.handle(RequestArrived(ctx, info, now))\n")
    assert not _calls_an_event_method("self._on_tick(None)\n")  # a harness's own
    assert not _calls_an_event_method("pause.on_request(view, program, now)\n")  # a stage's


def test_the_core_boundary_checker_sees_a_reach_past_it() -> None:
    assert _reaches_into_the_core("program = self.core.table.get(pid)\n")
    assert _reaches_into_the_core("n = scheduler.core.counters['x']\n")
    assert _reaches_into_the_core("decision, _ = core.on_request(ctx, info, now)\n")
    assert _reaches_into_the_core("scheduler._apply(actions)\n")
    assert _reaches_into_the_core("program = self.core.program(pid)\n")
    assert _reaches_into_the_core("metrics = GatewayMetrics(core.programs, pool)\n")
    assert _reaches_into_the_core("for b in self.core.backends.values():\n    pass\n")
    assert not _reaches_into_the_core("for b in self.core.backend_views().values():\n    pass\n")
    assert not _reaches_into_the_core("program = self.core.snapshot(pid)\n")
    assert not _reaches_into_the_core("program = self.scheduler.program(pid)\n")
    assert not _reaches_into_the_core("out = self.core.handle(event)\nself._apply(out.actions)\n")
    assert not _reaches_into_the_core("out['counters'] = result.counters\n")


# httpx-style: every module of the package (each folder's and the root's) says what it
# exports in `__all__`, a list of names it binds; a name another module, a test or a script
# imports from it is one of them. Read from the source: importing every module would import
# the optional integrations too (litellm's hook, which reaches for the network).
_EXPORTING = sorted(TOP_LEVEL)


def _exporting_modules() -> list[Path]:
    """Every module of the package: the root's and each folder's."""
    return [*sorted(ROOT.glob("*.py")), *(p for f in _EXPORTING for p in (ROOT / f).rglob("*.py"))]


def _bound_names(body: list[ast.stmt]) -> set[str]:
    """The names a module's top level binds (through `if`/`try` branches too)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.If | ast.Try):
            handlers = [h.body for h in node.handlers] if isinstance(node, ast.Try) else []
            for part in (node.body, node.orelse, *handlers):
                names |= _bound_names(part)
    return names


def _exports(source: str) -> list[str] | None:
    """A module's `__all__`, a literal list of names at its top level (None: it has none)."""
    for node in ast.parse(source).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
            value = ast.literal_eval(node.value)
            assert isinstance(value, list) and all(isinstance(n, str) for n in value)
            return value
    return None


def _export_problems(source: str) -> list[str]:
    exported = _exports(source)
    if exported is None:
        return ["no __all__"]
    bound = _bound_names(ast.parse(source).body)
    return [
        f"__all__ names {name!r}, which it does not bind" for name in exported if name not in bound
    ]


@pytest.mark.parametrize("folder", [".", *_EXPORTING])
def test_every_module_says_what_it_exports(folder: str) -> None:
    # ".": the package root's own modules (`__init__`, `_version`).
    paths = ROOT.glob("*.py") if folder == "." else (ROOT / folder).rglob("*.py")
    wrong = {
        f"{path.relative_to(ROOT)}: {problem}"
        for path in paths
        for problem in _export_problems(path.read_text())
    }
    assert not wrong, sorted(wrong)


def test_every_folder_of_the_package_is_checked_for_exports() -> None:
    # A new subpackage joins TOP_LEVEL (the layering rules), and with it the exports' checks.
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages <= set(_EXPORTING), sorted(packages - set(_EXPORTING))


def test_what_other_modules_import_from_a_module_is_in_its_exports() -> None:
    # Within a folder too: a name its neighbours import is part of a module's interface.
    # (`_`-names stay private, outside `__all__`; no test imports one: see below.)
    paths = {_module_name(p): p for p in _exporting_modules()}
    importers = [*_exporting_modules(), *(ROOT / "scripts").rglob("*.py")]
    importers += [*(ROOT / "tests").rglob("*.py")]
    wrong = set()
    for importer in importers:
        for node in ast.walk(ast.parse(importer.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module not in paths:
                continue
            if paths[node.module] == importer:
                continue
            exported = _exports(paths[node.module].read_text()) or []
            wrong |= {
                f"{importer.relative_to(ROOT)} imports {alias.name} from {node.module}"
                for alias in node.names
                if not alias.name.startswith("_")
                and alias.name not in exported
                and not (paths[node.module].parent / f"{alias.name}.py").exists()
            }
    assert not wrong, sorted(wrong)


def _private_imports(source: str) -> list[str]:
    """The `_`-names (dunders aside) and private modules a file imports from the package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("thunder_mw"):
            parts = [*(node.module or "").split("."), *(a.name for a in node.names)]
        elif isinstance(node, ast.Import):
            parts = [
                p for a in node.names if a.name.startswith("thunder_mw.") for p in a.name.split(".")
            ]
        else:
            continue
        found += [
            f"line {node.lineno}: {name}"
            for name in parts
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
        ]
    return found


def test_no_test_imports_a_private_name_from_the_package() -> None:
    # Tests speak to the package through what its modules export: a unit worth testing on its
    # own is public (in its module's `__all__`); the rest is tested through what uses it.
    wrong = [
        f"{path.relative_to(ROOT)} {hit}"
        for path in (ROOT / "tests").rglob("*.py")
        for hit in _private_imports(path.read_text())
    ]
    assert not wrong, wrong


def test_the_private_import_checker_sees_one() -> None:
    assert _private_imports("from thunder_mw.benchmarks.des import Simulation, _Program\n")
    assert _private_imports("def f():\n    from thunder_mw.middleware.forwarder import _data_of\n")
    assert _private_imports("import thunder_mw.policies._hidden\n")
    assert not _private_imports("from thunder_mw import __version__\n")
    assert not _private_imports("from support.polling import _helper\n")  # the tests' own
    assert not _private_imports("from thunder_mw.policies import Stage as _Stage\n")


def test_the_export_checker_sees_a_missing_or_unbound_export() -> None:
    assert _export_problems("X = 1\n") == ["no __all__"]
    assert _export_problems('__all__ = ["X", "Y"]\nX = 1\n') == [
        "__all__ names 'Y', which it does not bind"
    ]
    bound = 'from a import B\n__all__ = ["B", "C", "D"]\nif x:\n    C = 1\nelse:\n    D = 2\n'
    assert _export_problems(bound) == []
    assert _export_problems("__all__: list[str] = []\n") == []


# httpx-style module names: a module is public (no `_`) where something outside its folder
# uses it: a module of another folder or of the package root, its folder's `__init__` (which
# re-exports it), a test or a script, by an import or by its dotted name in a string
# (`import_module`, `python -m`, the CLI's subcommand table); or where it is a command (an
# `if __name__ == "__main__":` block). Every other module is `_`-named, an implementation
# detail of its folder, and nothing outside that folder imports a `_` module.
_MODULE_NAME = re.compile(r"thunder_mw(?:\.\w+){2}")


def _where(path: Path) -> str:
    """Who a file is, as a user of a module: its top-level folder (`tests`, `scripts`, a
    folder of the package, `.` for the root's modules), a folder's `__init__` by its path."""
    relative = path.relative_to(ROOT)
    if len(relative.parts) == 1:
        return "."
    return str(relative.with_suffix("")) if path.name == "__init__.py" else relative.parts[0]


def _modules_used(source: str, modules: frozenset[str]) -> set[str]:
    """The modules of `modules` a file imports, or names in a string, anywhere in it."""
    found = _source_imports(source, "", "", modules)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= set(_MODULE_NAME.findall(node.value)) & modules
    return found


def _is_command(source: str) -> bool:
    return any(
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        and [getattr(c, "value", None) for c in node.test.comparators] == ["__main__"]
        for node in ast.parse(source).body
    )


def _naming_problem(module: str, users: set[str], command: bool) -> str | None:
    """Why module `thunder_mw.<folder>.<name>`'s name is wrong, given where it is used
    (`_where` of each file using it) and whether it is a command; None if it is right."""
    _, folder, name = module.split(".")
    outside = sorted(users - {folder})
    if name.startswith("_") and (outside or command):
        return f"{module} is `_`-named but {'a command' if command else 'used by'} {outside}"
    if not name.startswith("_") and not outside and not command:
        return f"{module} is used only inside {folder}/: name it _{name}"
    return None


def test_a_module_is_private_unless_used_outside_its_folder() -> None:
    paths = {
        _module_name(p): p
        for folder in sorted(TOP_LEVEL)
        for p in (ROOT / folder).glob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    }
    modules = frozenset(paths)
    users: dict[str, set[str]] = {module: set() for module in modules}
    users_files = [
        *_exporting_modules(),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "scripts").rglob("*.py"),
    ]
    for path in users_files:
        for module in _modules_used(path.read_text(), modules):
            users[module].add(_where(path))
    wrong = [
        problem
        for module, path in sorted(paths.items())
        if (problem := _naming_problem(module, users[module], _is_command(path.read_text())))
    ]
    assert not wrong, wrong


def test_the_module_naming_checker_sees_a_misnamed_module() -> None:
    # Made-up modules: a real one named in a string here would count as used by a test.
    # Public, used inside its folder only: flagged; another folder, the folder's `__init__`,
    # a test or a `__main__` block makes it public.
    assert _naming_problem("thunder_mw.pkg.heap", {"pkg"}, command=False)
    assert not _naming_problem("thunder_mw.pkg._heap", {"pkg"}, command=False)
    assert not _naming_problem("thunder_mw.pkg.core", {"pkg", "middleware"}, command=False)
    assert not _naming_problem("thunder_mw.pkg.views", {"pkg/__init__"}, command=False)
    assert not _naming_problem("thunder_mw.pkg.estimates", {"tests"}, command=False)
    assert not _naming_problem("thunder_mw.pkg.digest", set(), command=True)
    # `_`-named, used from outside its folder or run as a command: flagged.
    assert _naming_problem("thunder_mw.pkg._core", {"pkg", "middleware"}, command=False)
    assert _naming_problem("thunder_mw.pkg._estimates", {"tests"}, command=False)
    assert _naming_problem("thunder_mw.pkg._digest", set(), command=True)
    # A use is an import anywhere in a file, or the module's dotted name in a string.
    modules = frozenset({"thunder_mw.pkg.server", "thunder_mw.pkg._metrics"})
    lazy = 'def f():\n    from thunder_mw.pkg import _metrics\nrun("-m thunder_mw.pkg.server")\n'
    assert _modules_used(lazy, modules) == modules
    assert _is_command('def main():\n    pass\n\nif __name__ == "__main__":\n    main()\n')
    assert not _is_command("def main():\n    pass\n")
    assert _where(ROOT / "policies" / "__init__.py") == "policies/__init__"
    assert _where(ROOT / "tests" / "unit" / "test_layering.py") == "tests"
    assert _where(ROOT / "scripts" / "benchmark_tables.py") == "scripts"
