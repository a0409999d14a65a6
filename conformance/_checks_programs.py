"""Checks on program lifecycle as the admin API shows it: release, final flags, concurrent
programs kept apart, and what happens to requests that carry no agent context at all."""

from __future__ import annotations

import asyncio
from typing import Any

from thunder_mw.conformance._catalogue import check
from thunder_mw.conformance._views import parent_of, steps_of
from thunder_mw.conformance.compare import first_difference
from thunder_mw.conformance.session import Fail, NotApplicable, Session, clip, tag_of

__all__ = ["OVERLAP"]

T, DB, DH = "thunderagent", "dynamo-body", "dynamo-headers"
# Held by the recording backend so requests of different programs overlap in flight.
OVERLAP = "recorder-delay-ms=150"


def _steps(view: dict[str, Any]) -> int | None:
    return steps_of(view)


async def _release_answer(s: Session, program: Any, released: bool) -> None:
    reply = await s.release(program)
    expected = {"program_id": program, "released": released}
    answer = reply.json()
    if reply.status != 200 or not isinstance(answer, dict):
        raise Fail(f"release answered {reply.status}, expected 200 {expected}", reply.body)
    got = {k: answer.get(k) for k in expected}
    diff = first_difference(expected, got, ordered=False)
    if diff:
        raise Fail(f"release answer: {diff}", answer)


@check(
    "release.live_program",
    "POST /programs/release of a live program answers 200 {program_id, released: true} and the "
    "program leaves /programs.",
    T,
)
async def _release_live(s: Session) -> str | None:
    program = s.program_id()
    await s.post_ok(s.chat(program_id=program, max_tokens=4))
    before = await s.programs_or_na()
    if program not in before:
        raise Fail(f"/programs does not list {program!r} after its request", sorted(before)[:20])
    await _release_answer(s, program, True)
    after = await s.programs_or_na()
    if program in after:
        raise Fail("the released program is still listed in /programs", after[program])
    return None


@check(
    "release.unknown_program",
    "Releasing a program the server never saw answers 200 {program_id, released: false}.",
    T,
)
async def _release_unknown(s: Session) -> str | None:
    await _release_answer(s, s.program_id("never-seen"), False)
    return None


@check(
    "release.invalid_id",
    "Releasing a blank program id is rejected with a 4xx naming `program_id`.",
)
async def _release_invalid(s: Session) -> str | None:
    reply = await s.release("   ")
    if not 400 <= reply.status < 500 or b"program_id" not in reply.body:
        raise Fail(f"expected a 4xx naming program_id, got {reply.status}", reply.body)
    return None


@check(
    "release.next_request_new_program",
    "After a release, the program's next request starts a new program (its step count restarts "
    "at 1).",
    T,
)
async def _release_restarts(s: Session) -> str | None:
    program = s.program_id()
    for _ in range(2):
        await s.post_ok(s.chat(program_id=program, max_tokens=4))
    views = await s.programs_or_na()
    if program not in views:
        raise Fail(f"/programs does not list {program!r}", sorted(views)[:20])
    if _steps(views[program]) is None:
        raise NotApplicable(
            "the program view shows no step count (`steps`, `step_count`, ...) to tell a new "
            "program from the old"
        )
    if _steps(views[program]) != 2:
        raise Fail("expected 2 steps before the release; /programs says", views[program])
    await _release_answer(s, program, True)
    await s.post_ok(s.chat(program_id=program, max_tokens=4))
    after = await s.programs_or_na()
    if _steps(after.get(program, {})) != 1:
        raise Fail("the request after the release did not start a new program", after.get(program))
    await s.release(program)
    return None


@check(
    "programs.concurrent_kept_apart",
    "Three programs with three requests each, all in flight at once, are counted apart in "
    "/programs (no request is attributed to another program).",
    T,
)
async def _concurrent(s: Session) -> str | None:
    programs = [s.program_id(name) for name in "ABC"]
    bodies = [s.chat(OVERLAP, program_id=p, max_tokens=4) for p in programs for _ in range(3)]
    replies = await asyncio.gather(*(s.post(b) for b in bodies))
    bad = [r for r in replies if not 200 <= r.status < 300]
    if bad:
        raise Fail(f"{len(bad)} of 9 concurrent requests failed ({bad[0].status})", bad[0].body)
    for body in bodies:
        s.received_once(body)
    views = await s.programs_or_na()
    for program in programs:
        if program not in views:
            raise Fail(f"/programs does not list {program!r}", sorted(views)[:20])
        steps = _steps(views[program])
        if steps is not None and steps != 3:
            raise Fail(f"{program} made 3 requests but /programs counts {steps}", views[program])
    for program in programs:
        await s.release(program)
    return None


async def _listed_or_na(s: Session, program: str, how: str) -> None:
    """The precondition of an end-of-program check: the program is listed while it runs."""
    views = await s.programs_or_na()
    if program not in views:
        raise NotApplicable(
            f"the server does not list a program named by {how}, so its end cannot be observed"
        )


async def _ends_after(
    s: Session,
    program: str,
    how: str,
    first: tuple[dict[str, Any], dict[str, str]],
    final: tuple[dict[str, Any], dict[str, str]],
) -> None:
    """`first` starts the program (which must then be listed); after `final` it is gone."""
    await s.post_ok(first[0], headers=first[1])
    await _listed_or_na(s, program, how)
    await s.post_ok(final[0], headers=final[1])
    s.received_once(final[0])
    views = await s.programs_or_na()
    if program in views:
        raise Fail("the program is still live after its final request", views[program])


@check(
    "lifecycle.trajectory_final",
    "A request with `nvext.agent_context.trajectory_final: true` ends its program (listed "
    "before it).",
    DB,
)
async def _trajectory_final(s: Session) -> str | None:
    program = s.program_id()

    def context(final: bool) -> dict[str, Any]:
        return {"trajectory_id": program, "session_id": f"s-{s.run_id}", "trajectory_final": final}

    first = s.chat(nvext={"agent_context": context(False)}, max_tokens=1)
    final = s.chat(nvext={"agent_context": context(True)}, max_tokens=1)
    await _ends_after(s, program, "nvext.agent_context", (first, {}), (final, {}))
    return None


@check(
    "lifecycle.session_final_header",
    "A request with `X-Dynamo-Session-Final: true` ends its program (listed before it).",
    DH,
)
async def _session_final(s: Session) -> str | None:
    program = s.program_id()
    named = {"X-Dynamo-Session-ID": program}
    final = {**named, "X-Dynamo-Session-Final": "true"}
    await _ends_after(
        s,
        program,
        "X-Dynamo-Session-ID",
        (s.chat(max_tokens=4), named),
        (s.chat(max_tokens=1), final),
    )
    return None


@check(
    "lifecycle.trajectory_final_header",
    "A request with `x-dynamo-trajectory-final: true` ends its program (listed before it).",
    DH,
)
async def _trajectory_final_header(s: Session) -> str | None:
    program = s.program_id()
    named = {"x-dynamo-trajectory-id": program}
    final = {**named, "x-dynamo-trajectory-final": "true"}
    await _ends_after(
        s,
        program,
        "x-dynamo-trajectory-id",
        (s.chat(max_tokens=4), named),
        (s.chat(max_tokens=1), final),
    )
    return None


# ---------------------------------------------------------------------------- precedence
async def _one_of_two_listed(
    s: Session, body: dict[str, Any], headers: dict[str, str], winner: str, loser: str
) -> None:
    await s.post_ok(body, headers=headers)
    views = await s.programs_or_na()
    if winner not in views and loser not in views:
        raise NotApplicable("the server lists neither program, so precedence cannot be observed")
    if winner not in views:
        raise Fail(f"the request was counted under {loser!r}, not {winner!r}", views[loser])
    if loser in views:
        raise Fail(f"{loser!r} is listed too: one request started two programs", views[loser])
    await s.release(winner)


@check(
    "precedence.session_over_trajectory_header",
    "When `X-Dynamo-Session-ID` and `x-dynamo-trajectory-id` name different programs, the "
    "request belongs to the session header's (ai-dynamo/dynamo#10896).",
    DH,
)
async def _session_over_trajectory(s: Session) -> str | None:
    winner, loser = s.program_id("session"), s.program_id("trajectory")
    headers = {"X-Dynamo-Session-ID": winner, "x-dynamo-trajectory-id": loser}
    await _one_of_two_listed(s, s.chat(max_tokens=4), headers, winner, loser)
    return None


@check(
    "precedence.body_over_header",
    "When the body (`nvext.agent_context.trajectory_id`) and a header (`X-Dynamo-Session-ID`) "
    "name different programs, the request belongs to the body's.",
    DB,
)
async def _body_over_header(s: Session) -> str | None:
    winner, loser = s.program_id("body"), s.program_id("header")
    body = s.chat(nvext={"agent_context": {"trajectory_id": winner}}, max_tokens=4)
    await _one_of_two_listed(s, body, {"X-Dynamo-Session-ID": loser}, winner, loser)
    return None


@check(
    "precedence.claude_code_child_parent",
    "A Claude Code child-agent turn belongs to its agent id, with the parent agent id (else "
    "the session id) as its parent, as Dynamo's session-ids page maps it.",
)
async def _claude_code_parent(s: Session) -> str | None:
    session, child, nested = s.program_id("session"), s.program_id("a1"), s.program_id("a2")
    top = {"x-claude-code-session-id": session, "x-claude-code-agent-id": child}
    deep = {**top, "x-claude-code-agent-id": nested, "x-claude-code-parent-agent-id": child}
    for headers in (top, deep):
        await s.post_ok(s.chat(max_tokens=4), headers=headers)
    views = await s.programs_or_na()
    if child not in views and nested not in views:
        raise NotApplicable("the server lists no program named by the Claude Code headers")
    for program, parent in ((child, session), (nested, child)):
        if program not in views:
            raise Fail(f"the child agent's program {program!r} is not listed", sorted(views)[:20])
        has_parent, value = parent_of(views[program])
        if not has_parent:
            raise NotApplicable("the program view shows no parent field to check")
        if value != parent:
            raise Fail(f"{program!r} has parent {value!r}, expected {parent!r}", views[program])
    for program in (child, nested):
        await s.release(program)
    return None


@check(
    "no_context.documented_behaviour",
    "A request with no agent context is handled as the server documents it (--without-context): "
    "forwarded with every field unchanged, or rejected with a 4xx naming the program id.",
    T,
    DB,
    DH,
)
async def _no_context(s: Session) -> str | None:
    body = s.chat(max_tokens=4, temperature=0)
    reply = await s.post(body)
    if s.without_context == "reject":
        if not 400 <= reply.status < 500 or b"program" not in reply.body:
            raise Fail(f"expected a 4xx naming the program id, got {reply.status}", reply.body)
        if s.received(body):
            raise Fail("the rejected request reached the backend", s.received(body)[0].body)
        return f"rejected: {clip(reply.body, 160)}"
    if not 200 <= reply.status < 300:
        raise Fail(f"expected the request to be forwarded, got {reply.status}", reply.body)
    forwarded = s.forwarded_json(body)
    diff = first_difference(body, forwarded, ordered=True)
    if diff:
        raise Fail(diff, forwarded)
    return None


@check(
    "no_context.not_shared",
    "Requests without agent context do not share one program (no catch-all `default` program "
    "counting them together).",
)
async def _not_shared(s: Session) -> str | None:
    if s.without_context == "reject":
        raise NotApplicable("the server rejects requests without context")
    # Precondition: the program views show traffic at all (a request with a program id).
    named = s.program_id()
    await s.post_ok(s.chat(program_id=named, max_tokens=4))
    before = await s.programs_or_na()
    if named not in before:
        raise NotApplicable("the program views do not show a request's program_id program")
    await s.release(named)
    before = await s.programs_or_na()
    bodies = [s.chat(OVERLAP, max_tokens=4) for _ in range(2)]
    during = asyncio.gather(*(s.post_ok(b) for b in bodies), return_exceptions=True)
    try:
        # One look while the backend holds both requests, one after they finished.
        await s.backend.wait_for([tag_of(b) for b in bodies])
        views_during = await s.programs_or_na()
    finally:
        outcomes = await during
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    after = await s.programs_or_na()
    for views in (views_during, after):
        for program, view in views.items():
            grew = (_steps(view) or 0) - (_steps(before.get(program, {})) or 0)
            in_flight = view.get("in_flight")
            if program == "default" or grew >= 2 or (isinstance(in_flight, int) and in_flight >= 2):
                raise Fail(f"context-less requests were counted together in {program!r}", view)
    return None
