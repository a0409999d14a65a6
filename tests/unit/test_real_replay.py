"""The real engine's committed runs replayed with thunder-mw's stand-in swapped
(lab/real_replay.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thunder_mw.benchmarks.scenarios import POLICIES
from thunder_mw.lab.real_replay import replay

REAL = Path(__file__).resolve().parents[2] / "results" / "vllm-cpu-real.json"


def _report() -> dict[str, object]:
    report: dict[str, object] = json.loads(REAL.read_text())
    return report


def test_the_default_as_its_own_variant_replays_the_committed_figures() -> None:
    report = _report()
    figures = replay(report, "thunder-mw")
    assert figures["default"] == figures["thunder-mw"]
    for regime, doc in report["regimes"].items():  # type: ignore[attr-defined]
        assert (
            figures["default"][regime]["median"] == doc["simulated"]["thunder-mw"]["steps_per_min"]
        )
        assert len(figures["default"][regime]["by_draw"]) == len(doc["simulated_by_draw"])


def test_a_variant_replays_differently_and_the_default_is_restored() -> None:
    default = POLICIES["thunder-mw"]
    figures = replay(_report(), "thunder-mw/no-admission")
    assert POLICIES["thunder-mw"] is default
    assert figures["thunder-mw/no-admission"] != figures["default"]


def test_an_unknown_policy_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no-such-policy"):
        replay(_report(), "thunder-mw/no-such-policy")
