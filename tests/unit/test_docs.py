"""The docs stay true: the configuration reference is what the config models say, and every
relative link in README.md, CHANGELOG.md, benchmarks/README.md and docs/ points at a file
(and heading) that exists."""

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from thunder_mw.benchmarks.bench_cli import engine_counters, resolved_rules
from thunder_mw.benchmarks.scenarios import SCENARIOS
from thunder_mw.schemas.config_reference import config_reference
from thunder_mw.schemas.stage_params import AdmissionParams, PauseParams

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.md"
START, END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"
PAGES = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _reference_block(text: str) -> str:
    start = text.index(START) + len(START)
    return text[start : text.index(END)]


def test_configuration_reference_matches_the_config_models() -> None:
    assert _reference_block(REFERENCE.read_text()) == config_reference(), (
        "run: python scripts/update_config_reference.py"
    )


def test_update_script_check_fails_on_a_stale_reference(tmp_path: Path) -> None:
    script = (ROOT / "scripts" / "update_config_reference.py").read_text()
    stale = tmp_path / "docs" / "configuration.md"
    stale.parent.mkdir()
    stale.write_text(f"# Configuration\n\n{START}| key | old |\n{END}\n")
    copy = tmp_path / "scripts" / "update_config_reference.py"
    copy.parent.mkdir()
    copy.write_text(script)
    env_path = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    check = subprocess.run([sys.executable, str(copy), "--check"], env=env_path, check=False)
    assert check.returncode == 1
    subprocess.run([sys.executable, str(copy)], env=env_path, check=True)
    assert _reference_block(stale.read_text()) == config_reference()


def _anchor(heading: str) -> str:
    """GitHub's heading slug: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def _links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_an_existing_file(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_link_checker_sees_links_and_headings() -> None:
    assert _links(ROOT / "README.md"), "README.md has no relative links to check?"
    assert _anchor("Replaying against your own stack: `thunder-mw replay`") == (
        "replaying-against-your-own-stack-thunder-mw-replay"
    )


def test_the_tables_know_the_default_rules_the_result_files_record() -> None:
    # scripts/benchmark_tables.py reads result files alone (no thunder_mw import): its idea of
    # the default must follow the params' defaults, or stale rows would pass as current.
    spec = importlib.util.spec_from_file_location("tables", ROOT / "scripts/benchmark_tables.py")
    assert spec is not None and spec.loader is not None
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    resolved: dict[str, str] = {"admission_overflow": AdmissionParams().overflow}
    assert tables.DEFAULT_RULES == resolved
    # The tier rules as bench_cli.resolved_rules records them: as they act, on engines with a
    # host KV tier and without (the pause victim's drain order among them).
    for tiered in (True, False):
        scenario = replace(SCENARIOS["chat-control"], host_tier=tiered)
        recorded = resolved_rules(scenario, ["thunder-mw"])
        keys = (
            "resume_placement",
            "idle_fate",
            "tier_reload",
            "pause_victim",
            "recompute_overflow",
        )
        rules = tuple(recorded[k]["thunder-mw"] for k in keys)
        assert tables.DEFAULT_TIER_RULES[tiered] == rules
        assert rules[3].startswith(PauseParams().victim)
    counted = engine_counters(SCENARIOS["chat-control"], "thunder-mw")
    assert tables.DEFAULT_ENGINE_COUNTERS == counted
