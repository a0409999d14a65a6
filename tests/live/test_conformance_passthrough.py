"""No vacuous pass: the whole `full` profile against a proxy that forwards everything and reads
nothing. No check that asserts an effect of agent-context handling may pass there."""

from __future__ import annotations

import asyncio

import pytest
from support.asgi_servers import free_port, serving
from support.passthrough_proxy import passthrough_proxy

from thunder_mw.conformance.registry import checks_for
from thunder_mw.conformance.runner import run_conformance_suite

EFFECT_PREFIXES = ("accept.", "strip.", "reject.", "lifecycle.", "precedence.")


@pytest.mark.parametrize("views", [False, True], ids=["no-program-views", "empty-program-views"])
def test_no_effect_check_passes_against_a_plain_pass_through_proxy(views: bool) -> None:
    port = free_port()
    app = passthrough_proxy(f"http://127.0.0.1:{port}", empty_program_views=views)
    with serving(app) as proxy:
        result = asyncio.run(
            run_conformance_suite(target=proxy.url, backend_port=port, profile="full", wait_s=10)
        )
    effects = [c for c in result.checks if c.id.startswith(EFFECT_PREFIXES)]
    assert len(effects) == sum(c.id.startswith(EFFECT_PREFIXES) for c in checks_for("full"))
    passed = [c.id for c in effects if c.status == "pass"]
    assert passed == [], f"effect checks passed against a proxy that does nothing: {passed}"
    for c in effects:
        assert c.detail, f"{c.id} is {c.status} without a reason"
    # Each family is judged, not skipped wholesale: what the proxy visibly fails to do fails.
    statuses = {c.id: c.status for c in effects}
    assert statuses["strip.program_id.top_level"] == "fail"
    assert statuses["strip.dynamo_trajectory_headers"] == "fail"
    assert statuses["reject.nvext.agent_context.missing_trajectory_id"] == "fail"
    assert statuses["lifecycle.trajectory_final"] == "n/a"
    reason = next(c.detail for c in effects if c.id == "lifecycle.trajectory_final")
    # With empty views the old check passed ("not listed after its final request"); now its
    # precondition (listed before it) is what the report names.
    expected = "does not list a program" if views else "publishes no program views"
    assert expected in reason, reason
    # What a pass-through does do, it passes: streams and payloads are relayed unchanged.
    others = {c.id: c.status for c in result.checks if c.id not in statuses}
    assert others["stream.same_chunks"] == "pass" and others["stream.responses"] == "pass"
    assert others["no_context.byte_identical"] == "pass"
