"""The conformance suite end to end: `--self` passes every profile; its outputs and exit codes."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support.asgi_servers import serving
from support.conformance_broken_servers import FORWARDS_PROGRAM_ID, MiniGateway

from thunder_mw.conformance.cli import add_conformance_arguments, run_conformance
from thunder_mw.conformance.registry import PROFILES, checks_for
from thunder_mw.sim.ports import free_port


def conformance(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_conformance_arguments(parser)
    return run_conformance(parser.parse_args(list(argv)))


@pytest.mark.slow  # `--self` starts a `thunder-mw serve` process
def test_self_run_of_the_full_profile_passes_and_writes_both_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    rc = conformance("--self", "--profile", "full", "--report", str(report), "--junit", str(junit))
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads(report.read_text())
    assert list(data) == ["target", "profile", "started_at", "checks"]
    assert data["profile"] == "full" and data["target"].startswith("http://127.0.0.1:")
    assert [c["id"] for c in data["checks"]] == [c.id for c in checks_for("full")]
    assert {c["status"] for c in data["checks"]} == {"pass"}
    assert all(set(c) == {"id", "statement", "status", "detail"} for c in data["checks"])
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert suite.get("tests") == str(len(data["checks"])) and suite.get("failures") == "0"
    assert f"conformance checks: {len(data['checks'])} pass, 0 fail" in out


@pytest.mark.slow  # `--self` starts a `thunder-mw serve` process
@pytest.mark.parametrize("profile", [p for p in PROFILES if p != "full"])
def test_self_run_passes_every_narrower_profile(
    profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert conformance("--self", "--profile", profile) == 0, capsys.readouterr().out


@pytest.mark.slow  # `--self` starts a `thunder-mw serve` process
def test_self_run_starts_against_the_sglang_flavoured_backend(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = conformance(
        "--self", "--backend-flavor", "sglang", "--check", "accept.program_id.top_level"
    )
    assert rc == 0, capsys.readouterr().out


def test_a_failing_check_exits_non_zero_and_prints_the_offending_payload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    report = tmp_path / "report.json"
    with serving(MiniGateway(f"http://127.0.0.1:{port}", FORWARDS_PROGRAM_ID)) as gateway:
        rc = conformance(
            "--target", gateway.url, "--backend-port", str(port), "--profile", "thunderagent",
            "--check", "strip.program_id.top_level", "--report", str(report),
        )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL  strip.program_id.top_level" in out
    assert '"program_id"' in out  # the forwarded body that shows the leak
    check = json.loads(report.read_text())["checks"][0]
    assert check["status"] == "fail" and "payload:" in check["detail"]


def test_an_unreachable_target_is_a_setup_error_not_a_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = conformance(
        "--target", f"http://127.0.0.1:{free_port()}", "--backend-port", str(free_port()),
        "--wait", "0.5",
    )  # fmt: skip
    assert rc == 2
    assert "was not ready" in capsys.readouterr().err


def test_target_and_backend_port_are_required_without_self(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert conformance("--profile", "full") == 2


def test_list_names_every_check_with_its_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert conformance("--list") == 0
    out = capsys.readouterr().out
    for c in checks_for("full"):
        assert c.id in out


def test_every_check_belongs_to_full_and_profiles_only_hold_their_promises() -> None:
    full = {c.id for c in checks_for("full")}
    thunderagent = {c.id for c in checks_for("thunderagent")}
    assert thunderagent < full
    # ThunderAgent forwards docker_ids, forces a usage chunk and validates nothing.
    assert not thunderagent & {"strip.docker_ids", "stream.no_unrequested_chunk"}
    assert not {i for i in thunderagent if i.startswith("reject.")}
    assert "reject.nvext.agent_context.unknown_key" in {c.id for c in checks_for("dynamo-body")}
    assert "strip.dynamo_headers" in {c.id for c in checks_for("dynamo-headers")}


def test_the_reports_for_people_give_counts_per_profile_and_each_failures_payload(
    tmp_path: Path,
) -> None:
    port = free_port()
    md, page = tmp_path / "report.md", tmp_path / "report.html"
    checks = ["strip.program_id.top_level", "stream.same_chunks", "lifecycle.trajectory_final"]
    with serving(MiniGateway(f"http://127.0.0.1:{port}", FORWARDS_PROGRAM_ID)) as gateway:
        rc = conformance(
            "--target", gateway.url, "--backend-port", str(port), "--profile", "full",
            *(a for c in checks for a in ("--check", c)),
            "--report-md", str(md), "--report-html", str(page),
        )  # fmt: skip
    assert rc == 1
    text = md.read_text()
    assert "deviates from profile full: strip.program_id.top_level" in text
    assert "| `full` | 1 | 1 | 1 |" in text  # stream passes, strip fails, lifecycle n/a
    assert "### `strip.program_id.top_level`" in text and '"program_id": "conformance-' in text
    assert "`lifecycle.trajectory_final`: the server does not list a program" in text
    html = page.read_text()
    assert html.startswith("<!doctype html>") and "<h3 class=fail><code>strip.program_id" in html
    assert "&quot;program_id&quot;: &quot;conformance-" in html  # the payload, escaped
    assert "<td class=fail>1</td>" in html


def test_a_passing_run_says_the_target_conforms(capsys: pytest.CaptureFixture[str]) -> None:
    assert conformance("--self", "--check", "stream.same_chunks") == 0
    assert "conforms to profile full" in capsys.readouterr().out
