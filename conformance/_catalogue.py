"""The catalogue every conformance check registers itself in (`@check`): each has an id, a
one-line statement, and its profiles. registry.py imports the check modules and answers
which checks a profile holds; the check modules import only this, so nothing imports back.

A profile is what one kind of server promises. `full` is everything thunder-mw promises and
holds every check; the others hold only what ThunderAgent or a Dynamo-convention server
promises, so a run against them fails only where they break their own contract.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from thunder_mw.conformance.session import Session

__all__ = ["CHECKS", "PEER_CONTRACTS", "PROFILES", "PROFILE_MEANING", "Check", "CheckBody", "check"]

PROFILES = ("thunderagent", "dynamo-body", "dynamo-headers", "vllm-router", "smg", "full")
PROFILE_MEANING = {
    "thunderagent": "what ThunderAgent promises: program_id (top level or in extra_body) is "
    "accepted and stripped, docker_ids/tool_ids accepted, other fields forwarded unchanged, "
    "streams relayed, /programs and the release endpoint",
    "dynamo-body": "nvext.agent_context accepted, validated and stripped, plus forwarding "
    "fidelity, streaming and bad-body handling",
    "dynamo-headers": "X-Dynamo-Session-* headers accepted, validated and stripped, plus "
    "forwarding fidelity, streaming and bad-body handling",
    "vllm-router": "what the vLLM router (PyPI vllm-router 0.1.17, --enable-program-scheduling) "
    "documents: vllm_xargs.agentic_context names a program (listed in /scheduling/diagnostics), "
    "streams relayed, bad bodies refused; it re-serialises bodies and forwards vllm_xargs to the "
    "engine by design, so no fidelity or strip checks. In front of stock vLLM 0.32 that "
    "forwarded object is a 400 from the engine (vllm_xargs values must be scalars: "
    "tests/real/test_real_vllm_engine.py); only its header identity (program_scheduling_enable_key "
    "auto with x-session-id) reaches a stock engine",
    "smg": "what SGLang's model gateway (PyPI smg 1.13.0) documents: an OpenAI-compatible router "
    "that relays streams and refuses bad bodies; it reads no agent context and re-serialises "
    "bodies, so no strip, fidelity or program checks",
    "full": "everything thunder-mw promises (every check)",
}

# The peers' contracts name checks registered by the check modules (kept here, in one place,
# beside what each peer documents; tests/real/test_conformance_peers.py runs them).
_STREAMS_AND_BODIES = frozenset(
    {
        "stream.same_chunks",
        "stream.no_unrequested_chunk",
        "stream.usage_when_requested",
        "stream.completions",
        "body.non_json",
        "body.non_object",
        "body.empty",
    }
)
PEER_CONTRACTS: dict[str, frozenset[str]] = {
    "vllm-router": _STREAMS_AND_BODIES
    | {
        "accept.vllm_xargs.agentic_context",
        "forward.other_headers",
        "responses.whole",
        "stream.responses",
    },
    "smg": _STREAMS_AND_BODIES,
}

CheckBody = Callable[[Session], Awaitable[str | None]]


@dataclass(frozen=True)
class Check:
    id: str
    statement: str
    profiles: frozenset[str]
    run: CheckBody


CHECKS: dict[str, Check] = {}


def check(check_id: str, statement: str, *profiles: str) -> Callable[[CheckBody], CheckBody]:
    """Registers a check; it belongs to `full` and to the profiles named."""
    unknown = set(profiles) - set(PROFILES) | (set(profiles) & set(PEER_CONTRACTS))
    if unknown:
        raise ValueError(f"{check_id}: unknown profiles {sorted(unknown)}")
    if check_id in CHECKS:
        raise ValueError(f"duplicate check id {check_id}")

    def register(run: CheckBody) -> CheckBody:
        CHECKS[check_id] = Check(check_id, statement, frozenset({*profiles, "full"}), run)
        return run

    return register
