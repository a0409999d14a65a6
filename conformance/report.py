"""The suite's outputs: a readable table, the JSON report, JUnit XML for CI, and a Markdown or
HTML report for people (per-profile counts and each failure's payload, to attach to an issue)."""

from __future__ import annotations

import html
import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from thunder_mw.conformance.registry import PROFILE_MEANING, PROFILES, checks_for
from thunder_mw.conformance.runner import CheckResult, SuiteResult

__all__ = [
    "format_table",
    "profile_rows",
    "to_html",
    "to_json",
    "to_markdown",
    "verdict",
    "write_html",
    "write_json",
    "write_junit",
    "write_markdown",
]

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
    counts = _counts(result.checks)
    lines += [
        "",
        # Worded so CI's test-count reader keeps pytest's count, not this one.
        f"conformance checks: {counts['pass']} pass, {counts['fail']} fail, "
        f"{counts['n/a']} not applicable",
        verdict(result.target, result.profile, result.checks),
    ]
    return "\n".join(lines) + "\n"


def verdict(target: str, profile: str, checks: list[CheckResult]) -> str:
    failed = [c.id for c in checks if c.status == "fail"]
    if not failed:
        return f"{target} conforms to profile {profile}"
    return f"{target} deviates from profile {profile}: {', '.join(failed)}"


def _counts(checks: list[CheckResult]) -> dict[str, int]:
    return {s: sum(1 for c in checks if c.status == s) for s in ("pass", "fail", "n/a")}


def profile_rows(result: SuiteResult) -> list[tuple[str, dict[str, int], str]]:
    """(profile, counts, verdict) for the run's profile (over the checks run, `--check` may
    choose a few) and every other profile whose checks this run covered."""
    ran = {c.id: c for c in result.checks}
    rows = []
    for profile in PROFILES:
        ids = [c.id for c in checks_for(profile)]
        if profile == result.profile:
            rows.append(
                (profile, _counts(result.checks), verdict(result.target, profile, result.checks))
            )
        elif ids and all(i in ran for i in ids):
            chosen = [ran[i] for i in ids]
            rows.append((profile, _counts(chosen), verdict(result.target, profile, chosen)))
    return rows


def to_markdown(result: SuiteResult) -> str:
    lines = [
        f"# Agent-context conformance of {result.target}",
        "",
        f"`thunder-mw conformance --profile {result.profile}`, run {result.started_at}. "
        f"**{verdict(result.target, result.profile, result.checks)}.**",
        "",
        "| profile | pass | fail | n/a | what it expects |",
        "|---|---:|---:|---:|---|",
    ]
    for profile, counts, _ in profile_rows(result):
        lines.append(
            f"| `{profile}` | {counts['pass']} | {counts['fail']} | {counts['n/a']} | "
            f"{PROFILE_MEANING[profile]} |"
        )
    failed = [c for c in result.checks if c.status == "fail"]
    if failed:
        lines += ["", "## Failures"]
        for c in failed:
            reason, _, payload = c.detail.partition(" | payload: ")
            lines += ["", f"### `{c.id}`", "", c.statement, "", f"Found: {reason}"]
            if payload:
                lines += ["", "```json", payload, "```"]
    na = [c for c in result.checks if c.status == "n/a"]
    if na:
        lines += ["", "## Not applicable", ""]
        lines += [f"- `{c.id}`: {c.detail}" for c in na]
    passed = [c.id for c in result.checks if c.status == "pass"]
    if passed:
        lines += ["", "## Passed", "", ", ".join(f"`{i}`" for i in passed)]
    return "\n".join(lines) + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:70em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;"
    "text-align:left}.fail{color:#b00020}.pass{color:#1b5e20}.na{color:#666}"
    "pre{background:#f5f5f5;padding:.6em;white-space:pre-wrap;word-break:break-all}"
)


def to_html(result: SuiteResult) -> str:
    e = html.escape
    title = f"Agent-context conformance of {result.target}"
    rows = "".join(
        f"<tr><td><code>{e(p)}</code></td><td class=pass>{n['pass']}</td>"
        f"<td class=fail>{n['fail']}</td><td class=na>{n['n/a']}</td>"
        f"<td>{e(PROFILE_MEANING[p])}</td></tr>"
        for p, n, _ in profile_rows(result)
    )
    summary = verdict(result.target, result.profile, result.checks)
    parts = [
        f"<!doctype html><html><head><meta charset=utf-8><title>{e(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{e(title)}</h1>",
        f"<p><code>thunder-mw conformance --profile {e(result.profile)}</code>, run "
        f"{e(result.started_at)}. <strong>{e(summary)}</strong></p>",
        "<table><tr><th>profile</th><th>pass</th><th>fail</th><th>n/a</th>"
        f"<th>what it expects</th></tr>{rows}</table>",
    ]
    failed = [c for c in result.checks if c.status == "fail"]
    if failed:
        parts.append("<h2>Failures</h2>")
        for c in failed:
            reason, _, payload = c.detail.partition(" | payload: ")
            parts.append(
                f"<h3 class=fail><code>{e(c.id)}</code></h3><p>{e(c.statement)}</p>"
                f"<p>Found: {e(reason)}</p>" + (f"<pre>{e(payload)}</pre>" if payload else "")
            )
    na = [c for c in result.checks if c.status == "n/a"]
    if na:
        items = "".join(f"<li><code>{e(c.id)}</code>: {e(c.detail)}</li>" for c in na)
        parts.append(f"<h2>Not applicable</h2><ul class=na>{items}</ul>")
    passed = [c for c in result.checks if c.status == "pass"]
    if passed:
        items = ", ".join(f"<code>{e(c.id)}</code>" for c in passed)
        parts.append(f"<h2>Passed</h2><p class=pass>{items}</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_markdown(result: SuiteResult, path: str | Path) -> None:
    Path(path).write_text(to_markdown(result), encoding="utf-8")


def write_html(result: SuiteResult, path: str | Path) -> None:
    Path(path).write_text(to_html(result), encoding="utf-8")
