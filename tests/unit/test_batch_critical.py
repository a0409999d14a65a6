"""The program that sets a fixed batch's makespan, and what its time was made of
(lab/batch_critical.py), on a small batch of the knee's workload."""

from __future__ import annotations

from dataclasses import replace

import pytest

from thunder_mw.benchmarks.scenarios import SCENARIOS
from thunder_mw.lab.batch_critical import last_program, main, parse_policy

SMALL = replace(SCENARIOS["swe-agent-knee"], engines=1, programs_per_engine=6)


def test_the_last_program_s_time_adds_up_to_the_makespan() -> None:
    last = last_program(SMALL, "thunder-mw", None, 0)
    # Every program arrives at t=0: its tools, its holds and the rest are its whole time.
    assert last.tools_s + last.held_s + last.rest_s == pytest.approx(last.makespan_s, abs=0.3)
    assert 0.0 <= last.first_sent_s <= last.makespan_s - last.tools_s
    assert last.tools_s > 0 and last.rest_s > 0


def test_a_client_cap_of_one_starts_the_last_program_after_the_others_ended() -> None:
    one = last_program(SMALL, "vllm_capped", 1, 0)
    free = last_program(SMALL, "vllm", None, 0)
    # A client cap holds nothing at the gateway; it starts each program after the one before.
    assert one.held_s == 0.0 and free.held_s == 0.0
    assert one.first_sent_s > free.first_sent_s
    assert one.makespan_s > free.makespan_s


def test_policies_are_checked_before_anything_runs() -> None:
    assert parse_policy("offload_capped@96") == ("offload_capped", 96)
    assert parse_policy("thunder-mw") == ("thunder-mw", None)
    with pytest.raises(ValueError, match="runs at a cap"):
        parse_policy("vllm_capped")
    with pytest.raises(ValueError, match="positive integer"):
        parse_policy("thunder-mw@0")
    with pytest.raises(ValueError, match="unknown policy"):
        parse_policy("thunder")


def test_a_malformed_policy_list_is_refused_with_its_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--scenario", "swe-agent-knee", "--policies", "thunder-mw,vllm_capped"])
    assert "runs at a cap" in capsys.readouterr().err
