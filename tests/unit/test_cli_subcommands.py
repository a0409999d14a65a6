"""The CLI loads a subcommand's module only when that subcommand is named: serving and every
`--help` work with the optional dependencies absent, and a tool that needs a missing one names
its extra and exits 2 without a traceback. Each case runs in a fresh interpreter in which the
extras' packages cannot be imported (`sys.modules[name] = None`), as on a bare install."""

from __future__ import annotations

import subprocess
import sys

from thunder_mw.cli.main import EXTRA_IMPORTS, SUBCOMMAND_TABLE, SUBCOMMANDS

BLOCK = "; ".join(f"sys.modules[{m!r}] = None" for m in EXTRA_IMPORTS)


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    code = f"import sys; {BLOCK}; from thunder_mw.cli.main import main; sys.exit(main({argv!r}))"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_every_subcommands_help_works_without_the_extras() -> None:
    for name in SUBCOMMANDS:
        done = _cli(name, "--help")
        assert done.returncode == 0, (name, done.stderr[-2000:])
        assert f"usage: thunder-mw {name}" in done.stdout


def test_naming_one_subcommand_imports_no_other_subcommands_module() -> None:
    others = {s.module for n, s in SUBCOMMAND_TABLE.items() if n not in ("serve", "plan")}
    others.discard("thunder_mw.cli.main")
    code = (
        f"import sys; {BLOCK}; from thunder_mw.cli.main import build_parser; "
        "build_parser('plan').parse_args(['plan', '--help'])"
    )
    probe = f"{code[: code.rindex(';')]}; print(sorted(m for m in sys.modules if m in {others!r}))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_a_missing_extra_is_named_with_exit_2_and_no_traceback() -> None:
    # The real-engine scenario fits a step-cost profile with numpy (the `bench` extra).
    done = _cli("bench", "--scenario", "vllm-cpu-real", "--resimulate", "--no-plots")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "pip install 'thunder-mw[bench]'" in done.stderr
    assert "'numpy'" in done.stderr and "Traceback" not in done.stderr


def test_an_import_error_of_the_project_itself_is_not_dressed_as_a_missing_extra() -> None:
    code = (
        "import sys; sys.modules['thunder_mw.cli.plan'] = None; "
        "from thunder_mw.cli.main import main; sys.exit(main(['plan', '--help']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1 and "Traceback" in done.stderr
    assert "thunder-mw[" not in done.stderr
