"""One draw of the real engine's committed runs replayed call by call (lab/real_holds.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from thunder_mw.lab.real_holds import main, timeline

REAL = Path(__file__).resolve().parents[2] / "results" / "vllm-cpu-real.json"


def _report() -> dict[str, Any]:
    report: dict[str, Any] = json.loads(REAL.read_text())
    return report


def test_every_call_is_recorded_once_and_the_run_is_the_committed_replay() -> None:
    report = _report()
    doc = report["regimes"]["cheap"]
    draw = doc["config"]["draw_seeds"][0]
    records, metrics = timeline(report, "cheap", draw)
    calls = doc["config"]["calls"]
    assert len(records) == calls
    assert len({(r.program_id, r.call) for r in records}) == calls
    assert [r.sent_s for r in records] == sorted(r.sent_s for r in records)
    for r in records:
        assert r.decision in ("forward", "hold") and r.tokens > 0
        if r.decision == "hold":
            assert r.resumed_s is not None and r.resumed_s >= r.sent_s
        else:
            assert r.resumed_s is None and r.held_s == 0.0
    # The same run as the file's simulated half (`--resimulate` replays it alike).
    committed = doc["simulated_by_draw"][str(draw)]["thunder-mw"]["steps_per_min"]
    assert metrics["steps_per_min"] == committed


def test_plain_vllms_stand_in_holds_nothing() -> None:
    report = _report()
    draw = report["regimes"]["dear"]["config"]["draw_seeds"][0]
    records, _ = timeline(report, "dear", draw, "vllm")
    assert {r.decision for r in records} == {"forward"}


@pytest.mark.parametrize(
    ("regime", "draw", "policy", "named"),
    [
        ("warm", 0, "thunder-mw", "warm"),
        ("cheap", 1, "thunder-mw", "draw 1"),
        ("cheap", 0, "nope", "nope"),
    ],
)
def test_what_the_file_or_the_pipelines_lack_is_refused_by_name(
    regime: str, draw: int, policy: str, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        timeline(_report(), regime, draw, policy)


def test_the_command_prints_each_call_and_both_policies_figures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["--regime", "cheap", "--draw", "0"]) == 0
    out = capsys.readouterr().out
    assert "p0 call 0: " in out and "held in all: " in out
    assert "thunder-mw: steps_per_min " in out and "vllm: steps_per_min " in out
    with pytest.raises(SystemExit):
        main(["--regime", "cheap", "--draw", "0", str(tmp_path / "missing.json")])
    assert "no such result file" in capsys.readouterr().err
