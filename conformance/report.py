"""The suite's three outputs: a readable table, the JSON report and a JUnit XML file for CI."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from thunder_mw.conformance.runner import SuiteResult

_MARK = {"pass": "PASS", "fail": "FAIL", "n/a": "N/A "}


def to_json(result: SuiteResult) -> dict[str, Any]:
    return {
        "target": result.target,
        "profile": result.profile,
        "started_at": result.started_at,
        "checks": [
            {"id": c.id, "statement": c.statement, "status": c.status, "detail": c.detail}
            for c in result.checks
        ],
    }


def write_json(result: SuiteResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(result), indent=2, ensure_ascii=False) + "\n")


def write_junit(result: SuiteResult, path: str | Path) -> None:
    root = ET.Element("testsuites")
    suite = ET.SubElement(
        root,
        "testsuite",
        name=f"thunder-mw-conformance.{result.profile}",
        tests=str(len(result.checks)),
        failures=str(len(result.failed)),
        skipped=str(sum(1 for c in result.checks if c.status == "n/a")),
        timestamp=result.started_at,
    )
    ET.SubElement(
        ET.SubElement(suite, "properties"), "property", name="target", value=result.target
    )
    for c in result.checks:
        case = ET.SubElement(suite, "testcase", classname=result.profile, name=c.id)
        if c.status == "fail":
            ET.SubElement(
                case, "failure", message=c.detail[:200]
            ).text = f"{c.statement}\n{c.detail}"
        elif c.status == "n/a":
            ET.SubElement(case, "skipped", message=c.detail)
    tree = ET.ElementTree(root)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def format_table(result: SuiteResult) -> str:
    width = max((len(c.id) for c in result.checks), default=10)
    lines = [f"conformance of {result.target} (profile {result.profile})", ""]
    for c in result.checks:
        lines.append(f"{_MARK[c.status]}  {c.id:<{width}}  {c.statement}")
        if c.status != "pass" and c.detail:
            for part in textwrap.wrap(c.detail, 110, break_long_words=True) or [""]:
                lines.append(f"      {'':<{width}}  {part}")
    counts = {s: sum(1 for c in result.checks if c.status == s) for s in ("pass", "fail", "n/a")}
    lines += [
        "",
        # Worded so CI's test-count reader keeps pytest's count, not this one.
        f"conformance checks: {counts['pass']} pass, {counts['fail']} fail, "
        f"{counts['n/a']} not applicable",
    ]
    return "\n".join(lines) + "\n"
