"""Each conformance check can fail: a deliberately broken gateway fails exactly the right check."""

from __future__ import annotations

import asyncio

import pytest
from support.asgi_servers import serving
from support.conformance_broken_servers import (
    ADDS_USAGE_CHUNK,
    CORRECT,
    DROPS_EXTRA_BODY_SIBLINGS,
    ERRORS_500_ON_BAD_INPUT,
    FORWARDS_PROGRAM_ID,
    SORTS_KEYS,
    THUNDERAGENT_LIKE,
    Flaws,
    MiniGateway,
)

from thunder_mw.conformance.runner import SuiteResult, run_conformance_suite
from thunder_mw.sim.ports import free_port

MINI_GATEWAY_CHECKS = [
    "accept.program_id.top_level",
    "strip.program_id.top_level",
    "strip.program_id.extra_body",
    "fidelity.numbers",
    "fidelity.key_order",
    "fidelity.extra_body_siblings",
    "stream.same_chunks",
    "stream.no_unrequested_chunk",
    "stream.usage_when_requested",
    "reject.program_id.blank",
    "reject.program_id.wrong_type",
    "body.non_json",
    "body.non_object",
]


def run_against(flaws: Flaws, profile: str = "full", only: list[str] | None = None) -> SuiteResult:
    port = free_port()
    with serving(MiniGateway(f"http://127.0.0.1:{port}", flaws)) as gateway:
        return asyncio.run(
            run_conformance_suite(
                target=gateway.url, backend_port=port, profile=profile, only=only, wait_s=10
            )
        )


def statuses(result: SuiteResult) -> dict[str, str]:
    return {c.id: c.status for c in result.checks}


def failing(result: SuiteResult) -> set[str]:
    return {c.id for c in result.failed}


def detail(result: SuiteResult, check_id: str) -> str:
    return next(c.detail for c in result.checks if c.id == check_id)


def test_a_correct_gateway_passes_the_checks_the_broken_ones_fail() -> None:
    result = run_against(CORRECT, only=MINI_GATEWAY_CHECKS)
    assert failing(result) == set(), [(c.id, c.detail) for c in result.failed]
    assert len(result.checks) == len(MINI_GATEWAY_CHECKS)


def test_forwarding_program_id_fails_the_strip_check() -> None:
    result = run_against(FORWARDS_PROGRAM_ID, only=MINI_GATEWAY_CHECKS)
    assert failing(result) == {"strip.program_id.top_level"}
    assert "the backend received `program_id`" in detail(result, "strip.program_id.top_level")
    assert "conformance-" in detail(result, "strip.program_id.top_level")  # the payload


def test_dropping_extra_body_siblings_fails_the_extra_body_fidelity_check() -> None:
    result = run_against(DROPS_EXTRA_BODY_SIBLINGS, only=MINI_GATEWAY_CHECKS)
    assert failing(result) == {"fidelity.extra_body_siblings"}
    assert "extra_body" in detail(result, "fidelity.extra_body_siblings")


def test_reordering_keys_fails_only_the_key_order_check() -> None:
    result = run_against(SORTS_KEYS, only=MINI_GATEWAY_CHECKS)
    assert failing(result) == {"fidelity.key_order"}
    assert "key order changed" in detail(result, "fidelity.key_order")


def test_adding_a_usage_chunk_fails_the_unrequested_chunk_check() -> None:
    result = run_against(ADDS_USAGE_CHUNK, only=MINI_GATEWAY_CHECKS)
    assert failing(result) == {"stream.no_unrequested_chunk"}
    assert '"usage"' in detail(result, "stream.no_unrequested_chunk")


def test_answering_500_to_bad_input_fails_the_rejection_checks() -> None:
    result = run_against(ERRORS_500_ON_BAD_INPUT, only=MINI_GATEWAY_CHECKS)
    assert failing(result) == {
        "reject.program_id.blank",
        "reject.program_id.wrong_type",
        "body.non_json",
        "body.non_object",
    }
    assert "expected a 4xx" in detail(result, "reject.program_id.blank")


@pytest.mark.slow  # ~3 s
def test_a_thunderagent_like_gateway_passes_the_thunderagent_profile() -> None:
    result = run_against(THUNDERAGENT_LIKE, profile="thunderagent")
    assert failing(result) == set(), [(c.id, c.detail) for c in result.failed]
    assert statuses(result)["release.next_request_new_program"] == "pass"


@pytest.mark.parametrize(
    "check_id",
    [
        "strip.docker_ids",
        "stream.no_unrequested_chunk",
        "reject.program_id.blank",
        "body.non_json",
        "no_context.not_shared",
        "no_context.byte_identical",
    ],
)
def test_a_thunderagent_like_gateway_fails_what_only_the_full_profile_expects(
    check_id: str,
) -> None:
    result = run_against(THUNDERAGENT_LIKE, only=[check_id])
    assert statuses(result) == {check_id: "fail"}


@pytest.mark.slow  # runs the full profile against a thunder-mw subprocess
def test_a_gateway_that_does_not_read_the_body_form_fails_precedence_and_strip() -> None:
    # thunder-mw itself with `dynamo_body` turned off: the header names the program, the
    # body's nvext is forwarded, and the trajectory_final flag is never read.
    from thunder_mw.middleware.app import create_app
    from thunder_mw.schemas.config import ThunderConfig

    port = free_port()
    config = ThunderConfig(
        backends=[{"name": "recorder", "url": f"http://127.0.0.1:{port}"}],
        agent_context={"conventions": ["thunderagent", "dynamo_headers"]},
    )
    only = [
        "precedence.body_over_header",
        "strip.nvext.agent_context",
        "lifecycle.trajectory_final",
        "precedence.session_over_trajectory_header",
    ]
    with serving(create_app(config)) as gateway:
        result = asyncio.run(
            run_conformance_suite(
                target=gateway.url, backend_port=port, profile="full", only=only, wait_s=10
            )
        )
    assert statuses(result) == {
        "precedence.body_over_header": "fail",
        "strip.nvext.agent_context": "fail",
        "lifecycle.trajectory_final": "n/a",
        "precedence.session_over_trajectory_header": "pass",
    }
    assert "was counted under" in detail(result, "precedence.body_over_header")
