"""Engine side: the bodies thunder-mw forwarded during a `--self` run, replayed to the REAL vLLM
engine, are accepted, and vLLM's own log shows none of the agent-context fields arrived."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from support.real_vllm import RealVllm

from thunder_mw.conformance.cli import add_conformance_arguments, run_conformance

# Few and small (the replay caps max_tokens at 4): one body per check.
REPLAYED = [
    "accept.program_id.top_level",
    "accept.docker_ids",
    "accept.nvext.agent_context",
    "accept.dynamo_headers",
    "fidelity.numbers",
    "fidelity.nested_objects",
    "stream.usage_when_requested",
]
CONTEXT_FIELDS = {"program_id", "docker_ids", "tool_ids", "nvext", "agent_context", "extra_body"}


def test_forwarded_bodies_are_accepted_by_the_real_vllm_engine(
    vllm_engine: RealVllm, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_conformance_arguments(parser)
    report = tmp_path / "report.json"
    only = [arg for check_id in REPLAYED for arg in ("--check", check_id)]
    offset = vllm_engine.log_offset()
    args = parser.parse_args(
        ["--self", *only, "--replay-to", vllm_engine.url, "--report", str(report)]
    )
    rc = run_conformance(args)
    assert rc == 0, capsys.readouterr().out + vllm_engine.log_tail()
    checks = json.loads(report.read_text())["checks"]
    replayed = {c["id"]: c["status"] for c in checks if c["id"].startswith("engine.accepts:")}
    assert replayed == {f"engine.accepts:{check_id}": "pass" for check_id in REPLAYED}
    ignored = vllm_engine.ignored_fields_since(offset)
    assert "x_numbers" in ignored  # the log line is there: the engine saw the bodies
    assert not ignored & CONTEXT_FIELDS, ignored
