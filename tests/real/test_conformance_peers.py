"""The conformance suite against the real peers (installed by the `peers` extra): each conforms
to its own profile, and the whole `full` profile judges it exactly as its documented behaviour
predicts, so a change to the suite that misjudges a real server is caught."""

from __future__ import annotations

import asyncio
from collections.abc import Set
from pathlib import Path

import pytest
from support.asgi_servers import free_port
from support.real_peers import SMG, VLLM_ROUTER, Peer, running_peer

from thunder_mw.conformance.registry import PEER_CONTRACTS, checks_for
from thunder_mw.conformance.report import format_table
from thunder_mw.conformance.runner import SuiteResult, run_conformance_suite

pytestmark = pytest.mark.peers

ALL = {c.id for c in checks_for("full")}
VIEWLESS = {  # need program views; n/a where a server publishes none
    "release.live_program",
    "release.next_request_new_program",
    "programs.concurrent_kept_apart",
    "lifecycle.trajectory_final",
    "lifecycle.session_final_header",
    "lifecycle.trajectory_final_header",
    "precedence.session_over_trajectory_header",
    "precedence.body_over_header",
    "precedence.claude_code_child_parent",
    "no_context.not_shared",
}
HEADER_FORMS = {
    "dynamo_headers",
    "dynamo_trajectory_headers",
    "claude_code.child_agent",
    "litellm.header",
}
CHAT_FORMS = {i.removeprefix("accept.") for i in ALL if i.startswith("accept.")} - {
    "responses.program_id",
    "responses.nvext.agent_context",
}

# What each peer does, as its documentation and the first runs describe it:
EXPECTED: dict[str, dict[str, Set[str]]] = {
    # Reads vllm_xargs.agentic_context (its diagnostics list the program), re-serialises bodies
    # (adds defaults: every fidelity check fails), forwards every agent-context field and
    # header (by design for vllm_xargs), validates none, has no /programs routes. Its program
    # views are in /scheduling/diagnostics, where no Dynamo-named program ever appears, so the
    # lifecycle and precedence checks cannot observe anything.
    VLLM_ROUTER.name: {
        "pass": PEER_CONTRACTS["vllm-router"],
        "n/a": VIEWLESS
        - {
            "release.live_program",
            "release.next_request_new_program",
            "programs.concurrent_kept_apart",
        },
    },
    # Reads no agent context, publishes no program views, drops client headers (so stripping
    # a header cannot be told from dropping it), re-serialises chat bodies and refuses unknown
    # fields in /v1/responses bodies (a program_id there is a 400).
    SMG.name: {
        "pass": PEER_CONTRACTS["smg"],
        "n/a": VIEWLESS
        | {f"accept.{f}" for f in CHAT_FORMS}
        | {f"strip.{f}" for f in HEADER_FORMS},
    },
}


def run_against(peer: Peer, profile: str, tmp_path: Path) -> SuiteResult:
    port = free_port()
    with running_peer(peer, port, tmp_path / f"{peer.name}.log") as url:
        return asyncio.run(
            run_conformance_suite(target=url, backend_port=port, profile=profile, wait_s=60)
        )


@pytest.mark.parametrize("peer", [VLLM_ROUTER, SMG], ids=lambda p: p.name)
def test_each_peer_conforms_to_its_own_profile(peer: Peer, tmp_path: Path) -> None:
    result = run_against(peer, peer.name, tmp_path)
    assert {c.id for c in result.checks} == PEER_CONTRACTS[peer.name]
    assert result.failed == [], format_table(result)
    assert f"conforms to profile {peer.name}" in format_table(result)


@pytest.mark.parametrize("peer", [VLLM_ROUTER, SMG], ids=lambda p: p.name)
def test_the_full_profile_judges_each_peer_as_its_behaviour_predicts(
    peer: Peer, tmp_path: Path
) -> None:
    result = run_against(peer, "full", tmp_path)
    expected = EXPECTED[peer.name]
    want = {i: "pass" for i in expected["pass"]} | {i: "n/a" for i in expected["n/a"]}
    want |= {i: "fail" for i in ALL - set(want)}
    got = {c.id: c.status for c in result.checks}
    wrong = {i: (got.get(i), want[i]) for i in want if got.get(i) != want[i]}
    assert not wrong, f"(got, expected) per check: {wrong}\n{format_table(result)}"
    for c in result.checks:
        assert c.status == "pass" or c.detail, f"{c.id} is {c.status} without a reason"
