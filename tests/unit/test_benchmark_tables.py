"""scripts/benchmark_tables.py's readings of result files that the docs' blocks do not pin."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tables() -> ModuleType:
    # The script reads result files alone (no thunder_mw import); loaded as the docs test does.
    spec = importlib.util.spec_from_file_location("tables", ROOT / "scripts/benchmark_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pair(ratio: float) -> dict[str, object]:
    return {"steps_per_min_ratio": {"ratio": ratio, "ci95": [ratio - 0.1, ratio + 0.1]}}


def test_the_real_engine_table_takes_each_regimes_own_client_cap(tables: ModuleType) -> None:
    # The benchmark picks the client cap per regime (cap 3 in one, cap 2 in the other): the
    # row is the cap each regime ran, named in its cell, not a row missing where one differs.
    cheap = {"thunder-mw/direct/cap-3": _pair(1.24), "thunder-mw/direct": _pair(0.94)}
    dear = {"thunder-mw/direct/cap-2": _pair(1.26)}
    assert tables._real_pair(cheap, "direct/cap") == (cheap["thunder-mw/direct/cap-3"], "cap 3")
    assert tables._real_pair(dear, "direct/cap") == (dear["thunder-mw/direct/cap-2"], "cap 2")
    assert tables._real_pair(dear, "direct") == (None, "")
    assert tables._real_pair(cheap, "direct") == (cheap["thunder-mw/direct"], "")


def test_a_figures_wall_time_says_which_runs_it_is_of(tables: ModuleType) -> None:
    # `bench --rerun thunder-mw` writes the reruns' wall time: the table must not pass it off
    # as the whole scenario's.
    config: dict[str, object] = {"policies": {"offload": [], "thunder-mw": []}}
    rerun = {"config": config, "reused": {"policies": ["offload"], "wall_s": 211.5}}
    note = tables._reused_from(rerun)
    assert note.startswith(" for thunder-mw, the other policies' runs reused")
    assert note.endswith("(the file they came from: wall 211.5 s)")
    assert tables._reused_from({"config": config}) == ""


def test_a_regime_the_engine_did_not_measure_as_described_is_named_so(
    tables: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tiny model on a CPU without AVX-512 measured a dear regime's recompute cost: the
    # table must not present its figures under the cheap regime's name alone.
    pair = {"steps_per_min_ratio": {"ratio": 1.15, "ci95": [1.05, 1.25], "verdict": "win"}}
    regime = {"decode_steps_per_recompute": 37.6, "paired": {"thunder-mw/direct": pair}}
    doc = {"regimes": {"cheap": {**regime, "as_described": False}, "dear": regime}}
    (tmp_path / "vllm-cpu-real.json").write_text(json.dumps(doc))
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    head = tables.real_engine_table().splitlines()[0]
    assert "cheap (37.6 decode steps per recompute, NOT as described)" in head
    assert "dear (37.6 decode steps per recompute): " in head
