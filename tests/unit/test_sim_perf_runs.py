"""lab/sim_perf.py's timed scenario runs (issue 43): one small run's record, and `--part runs`
keeping the decode-only figures already in the file."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from thunder_mw.benchmarks.scenarios import POLICIES, SCENARIOS
from thunder_mw.lab import sim_perf

# The smallest published DES scenario: about half a second.
SMALL = "chat-control:offload"


def test_a_run_record_counts_engine_steps_per_wall_second() -> None:
    record = sim_perf.time_run(SMALL)
    assert set(record) >= {
        "scenario",
        "policy",
        "seed",
        "wall_s",
        "engine_steps",
        "steps_per_s",
        "load_1m_before",
        "load_1m_after",
    }
    assert (record["scenario"], record["policy"], record["seed"]) == (
        "chat-control",
        "offload",
        0,
    )
    assert record["engine_steps"] > 0 and record["wall_s"] > 0
    # wall_s is rounded to 0.01 s; steps/s is computed from the unrounded time.
    low = record["engine_steps"] / (record["wall_s"] + 0.005)
    high = record["engine_steps"] / max(record["wall_s"] - 0.005, 1e-9)
    assert low - 1 <= record["steps_per_s"] <= high + 1


def test_runs_part_keeps_the_decode_figures_and_judges_the_target(tmp_path: Path) -> None:
    out = tmp_path / "sim-perf.json"
    out.write_text(json.dumps({"engine_steps_per_s_256_running": 44931, "runs": 3}))
    assert sim_perf.main(["--part", "runs", "--runs", SMALL, "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["engine_steps_per_s_256_running"] == 44931
    part = result["scenario_runs"]
    assert [r["scenario"] for r in part["runs"]] == ["chat-control"]
    per_run = part["targets"][0]
    assert per_run["goal_s"] == 60.0
    assert per_run["met"] is (part["slowest_run"]["wall_s"] <= 60.0)


def test_default_runs_name_published_des_scenarios() -> None:
    for spec in sim_perf.DEFAULT_RUNS:
        name, policy = spec.split(":")[:2]
        assert name in SCENARIOS and name not in ("vllm-cpu-real", "live-small")
        assert policy in POLICIES


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises((KeyError, ValueError)):
        sim_perf.time_run("chat-control:no-such-policy")


def test_keep_adds_runs_to_those_in_the_file(tmp_path: Path) -> None:
    out = tmp_path / "sim-perf.json"
    earlier = {"scenario": "x", "policy": "y", "seed": 0, "wall_s": 99.0}
    rerun = {"scenario": "chat-control", "policy": "offload", "seed": 0, "wall_s": 1e6}
    out.write_text(json.dumps({"scenario_runs": {"runs": [earlier, rerun]}}))
    args = ["--part", "runs", "--keep", "--runs", SMALL, "--output", str(out)]
    assert sim_perf.main(args) == 0
    part = json.loads(out.read_text())["scenario_runs"]
    assert [r["scenario"] for r in part["runs"]] == ["x", "chat-control"]
    assert part["runs"][1]["wall_s"] < 1e6
    assert part["slowest_run"]["scenario"] == "x" and part["targets"][0]["met"] is False


def _copying(
    source: Path, change: dict[str, object] | None = None
) -> Callable[[str, Path], list[str]]:
    """A stand-in for `thunder-mw bench`: writes `source`'s document (changed by `change`,
    the clocks moved) where the command would write its result."""

    def command(name: str, output: Path) -> list[str]:
        doc = json.loads(source.read_text())
        doc.update({"wall_s": 1.0, "run_wall_s": {}, **(change or {})})
        doc.pop("reused", None)
        script = "import sys; open(sys.argv[1], 'w').write(sys.argv[2])"
        return [sys.executable, "-c", script, str(output), json.dumps(doc)]

    return command


def test_a_whole_scenario_is_timed_and_checked_against_the_committed_file(
    tmp_path: Path,
) -> None:
    committed = tmp_path / "chat-control.json"
    committed.write_text(
        json.dumps({"seeds": [0, 1], "results": {"a": {"x": 1}, "b": {"x": 2}}, "wall_s": 9})
    )
    same = sim_perf.scenarios_part(
        ["chat-control"],
        results_dir=tmp_path,
        command=_copying(committed),
        keep_in=tmp_path / "fresh",
    )
    kept = json.loads((tmp_path / "fresh" / "chat-control.json").read_text())
    assert kept["results"] == {"a": {"x": 1}, "b": {"x": 2}} and kept["wall_s"] == 1.0
    record = same["scenarios"][0]
    assert record["reproduces_committed"] is True and record["differs_in"] == []
    assert (record["seeds"], record["policies"]) == (2, 2) and record["wall_s"] >= 0
    assert same["target"]["goal_s"] == 900.0 and same["target"]["met_by_those_timed"] is True
    # A figure that moved: named, and the file does not reproduce.
    moved = sim_perf.scenarios_part(
        ["chat-control"],
        kept=[
            {"scenario": "hicache-batch192", "wall_s": 1000.0},
            {"scenario": "x-variants", "wall_s": 2e3},
        ],
        results_dir=tmp_path,
        command=_copying(committed, {"results": {"a": {"x": 1}, "b": {"x": 3}}}),
    )
    assert "reference_run_s" not in record  # none asked for
    assert moved["scenarios"][2]["differs_in"] == ["results"]
    assert moved["scenarios"][2]["reproduces_committed"] is False
    assert (
        moved["target"]["slowest_timed"] == "hicache-batch192"  # files of variants aside
        and moved["target"]["met_by_those_timed"] is False
    )


def test_the_other_parts_keep_the_whole_scenarios(tmp_path: Path) -> None:
    out = tmp_path / "sim-perf.json"
    whole = {"scenarios": [{"scenario": "x", "wall_s": 5.0}]}
    out.write_text(json.dumps({"whole_scenarios": whole}))
    assert sim_perf.main(["--part", "runs", "--runs", SMALL, "--output", str(out)]) == 0
    assert json.loads(out.read_text())["whole_scenarios"] == whole


def test_part_scenarios_refuses_an_unknown_or_missing_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim-perf.json"
    for extra, word in ((["--scenarios", "nope"], "nope"), ([], "--scenarios")):
        with pytest.raises(SystemExit):
            sim_perf.main(["--part", "scenarios", *extra, "--output", str(out)])
        assert word in capsys.readouterr().err
    assert not out.exists()


def test_rows_in_another_order_still_reproduce_but_a_moved_figure_does_not() -> None:
    committed = {"results": [{"policy": "a", "x": 1}, {"policy": "b", "x": 2}], "wall_s": 3}
    reordered = {"results": [{"policy": "b", "x": 2}, {"policy": "a", "x": 1}], "wall_s": 9}
    assert sim_perf.differs_in(reordered, committed) == []
    # A series keeps its order: a time series reversed is another series.
    assert sim_perf.differs_in({"ts": [1, 2]}, {"ts": [2, 1]}) == ["ts"]
    moved = {"results": [{"policy": "b", "x": 2}, {"policy": "a", "x": 5}]}
    assert sim_perf.differs_in(moved, committed) == ["results"]


def _des_file(folder: Path, stem: str, **config: object) -> None:
    doc = {
        "scenario": "tool-orchestra-knee",
        "mode": "des",
        "seed": 0,
        "config": {"policies": ["thunder-mw", "thunder-mw/fixed"], "seeds": [0, 1], **config},
        "results": {"thunder-mw": {"x": 1}},
    }
    (folder / f"{stem}.json").write_text(json.dumps(doc))


def test_a_file_of_variants_is_remade_with_the_policies_and_seeds_it_records(
    tmp_path: Path,
) -> None:
    assert SCENARIOS["tool-orchestra-knee"].sweep  # so that a file without one says so
    _des_file(tmp_path, "tool-orchestra-knee-variants", sweep=[])
    out = tmp_path / "fresh.json"
    command = sim_perf.rerun_command("tool-orchestra-knee-variants", out, tmp_path)
    assert command[command.index("--scenario") + 1] == "tool-orchestra-knee"
    assert command[command.index("--policies") + 1] == "thunder-mw,thunder-mw/fixed"
    assert command[command.index("--seeds") + 1] == "2" and "--no-sweep" in command
    assert command[command.index("--output") + 1] == str(out)
    # A published scenario: its own command, whatever files of variants lie beside it.
    assert sim_perf.rerun_command("tool-orchestra-knee", out, tmp_path) == (
        sim_perf.bench_command("tool-orchestra-knee", out)
    )
    _des_file(tmp_path, "tool-orchestra-knee-swept", sweep=[[4, 96]])
    assert "--no-sweep" not in sim_perf.rerun_command("tool-orchestra-knee-swept", out, tmp_path)


@pytest.mark.parametrize(
    ("stem", "doc", "word"),
    [
        ("nope", None, "neither"),
        ("live-x", {"scenario": "tool-orchestra-knee", "mode": "live", "config": {}}, "not a DES"),
        ("gaps", {"scenario": "tool-orchestra-knee", "mode": "des", "seed": 0,
                  "config": {"policies": ["a"], "seeds": [0, 2]}}, "consecutive"),
    ],
)  # fmt: skip
def test_what_cannot_be_remade_is_refused_by_name(
    tmp_path: Path, stem: str, doc: dict[str, object] | None, word: str
) -> None:
    if doc is not None:
        (tmp_path / f"{stem}.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=word) as caught:
        sim_perf.rerun_command(stem, tmp_path / "fresh.json", tmp_path)
    assert stem in str(caught.value)


def test_the_three_hour_target_counts_every_committed_des_file(tmp_path: Path) -> None:
    _des_file(tmp_path, "tool-orchestra-knee-variants", sweep=[])
    _des_file(tmp_path, "tool-orchestra-knee-drain", sweep=[])
    (tmp_path / "other.json").write_text(json.dumps({"mode": "live", "scenario": "x"}))
    assert sim_perf.des_result_files(tmp_path) == [
        "tool-orchestra-knee-drain",
        "tool-orchestra-knee-variants",
    ]
    seen: list[dict[str, Any]] = []
    one = sim_perf.scenarios_part(
        ["tool-orchestra-knee-variants"],
        results_dir=tmp_path,
        command=_copying(tmp_path / "tool-orchestra-knee-variants.json"),
        on_record=seen.append,  # what main writes after each file, so none timed is lost
    )
    assert seen == [one]
    every = one["all_files"]
    assert (every["files"], every["timed"]) == (2, 1) and every["met"] is None
    assert every["untimed"] == ["tool-orchestra-knee-drain"]
    assert one["scenarios"][0]["reproduces_committed"] is True
    # Past three hours already: missed, whatever is left untimed.
    slow = [{"scenario": "tool-orchestra-knee-drain", "wall_s": 11_000.0}]
    both = sim_perf.scenarios_part(
        ["tool-orchestra-knee-variants"],
        kept=slow,
        results_dir=tmp_path,
        command=_copying(tmp_path / "tool-orchestra-knee-variants.json"),
    )
    assert both["all_files"]["timed"] == 2 and both["all_files"]["met"] is False
    assert both["all_files"]["untimed"] == []


def test_a_whole_scenario_is_timed_beside_the_machines_speed_then(tmp_path: Path) -> None:
    # The reference is measured before the scenario, once per file, and recorded with it.
    committed = tmp_path / "chat-control.json"
    committed.write_text(json.dumps({"seeds": [0], "results": {"a": {"x": 1}}, "wall_s": 9}))
    order: list[str] = []

    def reference() -> float:
        order.append("reference")
        return 2.5

    def command(name: str, output: Path) -> list[str]:
        order.append("scenario")
        return _copying(committed)(name, output)

    summary = sim_perf.scenarios_part(
        ["chat-control"], results_dir=tmp_path, command=command, reference=reference
    )
    assert summary["scenarios"][0]["reference_run_s"] == 2.5
    assert order == ["reference", "scenario"]
    assert sim_perf.REFERENCE_RUN.split(":")[0] in summary["note"]
