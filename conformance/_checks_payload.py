"""Checks on everything that is not agent context: it reaches the engine unchanged (values,
types, key order), streams come back as the engine sent them, and odd bodies are handled."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from thunder_mw.conformance._catalogue import check
from thunder_mw.conformance.compare import first_difference
from thunder_mw.conformance.recording_backend import MODEL
from thunder_mw.conformance.session import Fail, NotApplicable, Reply, Session, clip

__all__ = ["ANY_FORWARDER", "LARGE_BODY_BYTES", "record_json"]

T, DB, DH = "thunderagent", "dynamo-body", "dynamo-headers"
ANY_FORWARDER = (T, DB, DH)
LARGE_BODY_BYTES = 1024 * 1024


async def _received_as(
    s: Session, sent: dict[str, Any], expected: dict[str, Any], tagged: dict[str, Any], program: str
) -> None:
    """Send `sent`; the engine must receive `expected` (found by `tagged`'s marker)."""
    await s.post_ok(sent)
    forwarded = s.forwarded_json(tagged)
    diff = first_difference(expected, forwarded, ordered=False)
    if diff:
        raise Fail(diff, forwarded)
    await s.release(program)


async def _forwarded_unchanged(
    s: Session,
    body: dict[str, Any],
    context: dict[str, Any],
    *,
    ordered: bool,
    raw: bytes | None = None,
) -> dict[str, Any]:
    """Send `body` plus the `context` fields (inserted after `messages`) and require the engine
    to receive exactly `body`."""
    sent: dict[str, Any] = {}
    for key, value in body.items():
        sent[key] = value
        if key == "messages":
            sent.update(context)
    program = next((v for v in context.values() if isinstance(v, str)), None)
    await s.post_ok(sent if raw is None else raw)
    forwarded = s.forwarded_json(body)
    # Context left in the body is the strip checks' finding; these judge every other field.
    others = {k: v for k, v in forwarded.items() if k not in context}
    diff = first_difference(body, others, ordered=ordered)
    if diff:
        raise Fail(diff, forwarded)
    if program:
        await s.release(program)
    return forwarded


@check(
    "fidelity.numbers",
    "Numbers reach the backend with the same type and value (big ints, -0.0, 1e300, 1.5e-10, "
    "2.0 stays a float, 1 stays an int).",
    *ANY_FORWARDER,
)
async def _numbers(s: Session) -> str | None:
    body = s.chat(
        max_tokens=4,
        temperature=0.7,
        top_p=1.0,
        seed=1234567890123,
        presence_penalty=-0.5,
        frequency_penalty=0,
        x_numbers={
            "big": 123456789012345678901234567890,
            "negative_zero": -0.0,
            "tiny": 1.5e-10,
            "huge": 1e300,
            "float_two": 2.0,
            "int_one": 1,
            "negative": -7,
            "bool": True,
        },
    )
    await _forwarded_unchanged(s, body, {"program_id": s.program_id()}, ordered=False)
    return None


@check(
    "fidelity.unicode",
    "Strings reach the backend with the same characters (accents, CJK, emoji, U+2028, escapes, "
    "a NUL) whether the client sent them escaped or raw.",
    *ANY_FORWARDER,
)
async def _unicode(s: Session) -> str | None:
    text = 'naïve café — 漢字 🚀 \u2028 "quoted" \\ back\\slash \t tab'
    body = s.chat(
        text,
        max_tokens=4,
        x_unicode={"ключ": "значение", "emoji 🎉": "✓", "nul": "a\u0000b", "rtl": "שלום"},
    )
    program = s.program_id()
    sent = {**body, "program_id": program}
    # Escaped on the wire (\u00ef...): a server that re-encodes must still deliver the same text.
    raw = json.dumps(sent, ensure_ascii=True).encode()
    await s.post_ok(raw)
    forwarded = s.forwarded_json(body)
    others = {k: v for k, v in forwarded.items() if k != "program_id"}
    diff = first_difference(body, others, ordered=False)
    if diff:
        raise Fail(diff, forwarded)
    await s.release(program)
    return None


@check(
    "fidelity.nested_objects",
    "Nested objects and arrays (nulls, empty {} and [], deep nesting) reach the backend intact.",
    *ANY_FORWARDER,
)
async def _nested(s: Session) -> str | None:
    body = s.chat(
        max_tokens=4,
        stop=["\n\n", "END"],
        response_format={"type": "text"},
        x_nested={
            "a": [{"b": {"c": [1, {"d": None}, [], {}]}}],
            "empty_object": {},
            "empty_list": [],
            "null": None,
        },
    )
    await _forwarded_unchanged(s, body, {"program_id": s.program_id()}, ordered=False)
    return None


@check(
    "fidelity.key_order",
    "Object keys reach the backend in the order the client sent them, at every depth.",
    *ANY_FORWARDER,
)
async def _key_order(s: Session) -> str | None:
    body = s.chat(
        zeta=1,
        alpha=2,
        max_tokens=4,
        x_order={"z": 1, "a": 2, "m": {"y": 1, "b": 2, "k": [{"q": 1, "c": 2}]}},
        temperature=0,
    )
    await _forwarded_unchanged(s, body, {"program_id": s.program_id()}, ordered=True)
    return None


@check(
    "fidelity.extra_body_siblings",
    "Keys next to `program_id` inside a nested `extra_body` reach the backend in that "
    "`extra_body`, unchanged.",
    T,
)
async def _extra_body_siblings(s: Session) -> str | None:
    program = s.program_id()
    tagged = s.chat(max_tokens=4)
    sent = {**tagged, "extra_body": {"top_k": 5, "program_id": program, "repetition_penalty": 1.1}}
    expected = {**tagged, "extra_body": {"top_k": 5, "repetition_penalty": 1.1}}
    await _received_as(s, sent, expected, tagged, program)
    return None


@check(
    "fidelity.nvext_siblings",
    "Keys next to `agent_context` inside `nvext` reach the backend in that `nvext`, unchanged.",
)
async def _nvext_siblings(s: Session) -> str | None:
    program = s.program_id()
    tagged = s.chat(max_tokens=4)
    context = {"session_type_id": "c", "session_id": "s", "trajectory_id": program}
    sent = {**tagged, "nvext": {"annotations": ["x"], "agent_context": context, "top_k": 3}}
    expected = {**tagged, "nvext": {"annotations": ["x"], "top_k": 3}}
    await _received_as(s, sent, expected, tagged, program)
    return None


@check(
    "forward.other_headers",
    "Request headers that are not agent context (e.g. a trace header) reach the backend.",
)
async def _other_headers(s: Session) -> str | None:
    program = s.program_id()
    body = s.chat(program_id=program, max_tokens=4)
    trace = f"trace-{s.run_id}"
    await s.post_ok(body, headers={"X-Conformance-Trace": trace})
    record = s.received_once(body)
    if record.header("x-conformance-trace") != trace:
        raise Fail("the backend did not receive X-Conformance-Trace", record.headers)
    await s.release(program)
    return None


@check(
    "no_context.byte_identical",
    "A request with no agent context reaches the backend byte for byte (spacing and escapes "
    "included).",
)
async def _no_context_bytes(s: Session) -> str | None:
    if s.without_context == "reject":
        raise NotApplicable("the server rejects requests without context (--without-context)")
    body = s.chat("caf\u00e9", max_tokens=4, temperature=1.0)
    raw = json.dumps(body, ensure_ascii=True, indent=1).encode()
    await s.post_ok(raw)
    record = s.received_once(body)
    if record.body != raw:
        raise Fail("the forwarded bytes differ from the bytes sent", record.body)
    return None


# ---------------------------------------------------------------------------- streaming
def _is_usage_only(event: bytes) -> bool:
    try:
        data = json.loads(event)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("usage") is not None and not data.get("choices")


async def _stream(s: Session, path: str, **fields: Any) -> tuple[Reply, list[bytes]]:
    program = s.program_id()
    if path == "/v1/completions":
        tag = s.tag()
        body: dict[str, Any] = {"model": MODEL, "prompt": tag, "program_id": program, **fields}
    else:
        body = s.chat(program_id=program, **fields)
    sent = copy.deepcopy(body)
    reply = await s.post_ok(body, path=path)
    if reply.events is None:
        raise Fail(
            f"a streamed request was answered as {reply.headers.get('content-type')}", reply.body
        )
    backend_events = s.received_once(sent).sent_events
    await s.release(program)
    return reply, backend_events


def _same_chunks(client: list[bytes], backend: list[bytes]) -> None:
    """Every client event is a backend event, in order; every content event got through."""
    position = 0
    for event in client:
        while position < len(backend) and backend[position] != event:
            if not _is_usage_only(backend[position]):
                raise Fail(
                    f"backend event {position} never reached the client (got {clip(event, 200)})",
                    backend[position],
                )
            position += 1
        if position == len(backend):
            raise Fail("the client received an event the backend never sent", event)
        position += 1
    for missing in backend[position:]:
        if not _is_usage_only(missing):
            raise Fail("the stream ended before this backend event reached the client", missing)


@check(
    "stream.same_chunks",
    "A streamed chat answer reaches the client as the same events, byte for byte and in order, "
    "as the backend sent them ([DONE] included).",
    *ANY_FORWARDER,
)
async def _stream_same(s: Session) -> str | None:
    reply, backend = await _stream(s, "/v1/chat/completions", max_tokens=4, stream=True)
    assert reply.events is not None
    _same_chunks(reply.events, backend)
    return None


@check(
    "stream.no_unrequested_chunk",
    "A client that did not ask for `stream_options.include_usage` gets no usage chunk and no "
    "event the backend did not send.",
    DB,
    DH,
)
async def _stream_no_extra(s: Session) -> str | None:
    reply, backend = await _stream(s, "/v1/chat/completions", max_tokens=4, stream=True)
    assert reply.events is not None
    extra = [e for e in reply.events if _is_usage_only(e)]
    if extra:
        raise Fail("the client received a usage chunk it did not ask for", extra[0])
    _same_chunks(reply.events, backend)
    return None


@check(
    "stream.usage_when_requested",
    "A client that asks for `stream_options.include_usage` gets the backend's usage chunk "
    "exactly once.",
    *ANY_FORWARDER,
)
async def _stream_usage(s: Session) -> str | None:
    reply, backend = await _stream(
        s,
        "/v1/chat/completions",
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert reply.events is not None
    usage = [e for e in reply.events if _is_usage_only(e)]
    if len(usage) != 1:
        raise Fail(f"the client received {len(usage)} usage chunks, expected 1", reply.events)
    if usage[0] not in backend:
        raise Fail("the usage chunk differs from the backend's", usage[0])
    _same_chunks(reply.events, backend)
    return None


@check(
    "stream.completions",
    "A streamed /v1/completions answer reaches the client as the backend's events.",
)
async def _stream_completions(s: Session) -> str | None:
    reply, backend = await _stream(s, "/v1/completions", max_tokens=4, stream=True)
    assert reply.events is not None
    _same_chunks(reply.events, backend)
    if any(_is_usage_only(e) for e in reply.events):
        raise Fail("the client received a usage chunk it did not ask for", reply.events)
    return None


# ---------------------------------------------------------------------------- bodies
@check(
    "body.large",
    f"A {LARGE_BODY_BYTES // 1024} KiB request with a program_id is forwarded whole.",
    *ANY_FORWARDER,
)
async def _large(s: Session) -> str | None:
    filler = "lorem ipsum dolor sit amet " * (LARGE_BODY_BYTES // 27)
    body = s.chat(filler, max_tokens=4)
    await _forwarded_unchanged(s, body, {"program_id": s.program_id()}, ordered=True)
    return None


async def _bad_body(s: Session, raw: bytes, what: str) -> str | None:
    reply = await s.post(raw)
    if not 400 <= reply.status < 500:
        raise Fail(f"expected a 4xx for {what}, got {reply.status}", reply.body)
    tag = raw.decode("utf-8", "replace")
    tag = tag[tag.find("[conformance") : tag.find("]", tag.find("[conformance")) + 1]
    if tag and s.backend.containing(tag):
        raise Fail(f"{what} reached the backend", raw)
    return f"{reply.status}: {clip(reply.body, 160)}"


@check(
    "body.non_json", "A body that is not JSON gets a 4xx (not a 5xx) and is not forwarded.", DB, DH
)
async def _non_json(s: Session) -> str | None:
    raw = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "{s.tag()}"'.encode()
    return await _bad_body(s, raw, "a truncated JSON body")


@check(
    "body.non_object",
    "A JSON body that is not an object (an array) gets a 4xx (not a 5xx) and is not forwarded.",
    DB,
    DH,
)
async def _non_object(s: Session) -> str | None:
    return await _bad_body(s, json.dumps([s.tag(), MODEL]).encode(), "a JSON array body")


@check("body.empty", "An empty body gets a 4xx (not a 5xx).")
async def _empty(s: Session) -> str | None:
    return await _bad_body(s, b"", "an empty body")


@check(
    "body.concurrent_large",
    "Four 256 KiB requests of different programs in flight at once each reach the backend whole.",
)
async def _concurrent_large(s: Session) -> str | None:
    bodies = [s.chat(str(i) * (256 * 1024), max_tokens=4) for i in range(4)]
    programs = [s.program_id(str(i)) for i in range(4)]
    await asyncio.gather(
        *(
            _forwarded_unchanged(s, b, {"program_id": p}, ordered=True)
            for b, p in zip(bodies, programs, strict=True)
        )
    )
    return None


# ---------------------------------------------------------------------------- Responses API
def _named_events(raw: bytes) -> list[tuple[str | None, bytes]]:
    """(`event:` name or None, `data:` payload) of each SSE event, in order."""
    named = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = block.split(b"\n")
        data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
        if not data:
            continue
        names = [line[6:].strip().decode() for line in lines if line.startswith(b"event:")]
        named.append((names[0] if names else None, b"\n".join(data)))
    return named


@check(
    "responses.whole",
    "A /v1/responses answer (with a program_id) reaches the client as the backend sent it, "
    "usage included.",
)
async def _responses_whole(s: Session) -> str | None:
    program = s.program_id()
    body = s.responses(program_id=program, max_output_tokens=4)
    sent = copy.deepcopy(body)
    reply = await s.post_ok(body, path="/v1/responses")
    record = s.received_once(sent)
    diff = first_difference(record_json(record.answer), reply.json(), ordered=True)
    if diff:
        raise Fail(f"the client's answer differs from the backend's: {diff}", reply.body)
    await s.release(program)
    return None


@check(
    "stream.responses",
    "A streamed /v1/responses answer reaches the client as the backend's events, names "
    "(`event: response.completed`, ...) and data, in order.",
)
async def _responses_stream(s: Session) -> str | None:
    program = s.program_id()
    body = s.responses(program_id=program, max_output_tokens=4, stream=True)
    sent = copy.deepcopy(body)
    reply = await s.post_ok(body, path="/v1/responses")
    record = s.received_once(sent)
    expected = list(zip(record.sent_event_names, record.sent_events, strict=True))
    got = _named_events(reply.body)
    if got != expected:
        pairs = zip(got, expected, strict=False)
        first = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        where = f"event {first}" if first is not None else f"event count {len(got)}"
        raise Fail(f"the client's stream differs from the backend's at {where}", got[:3])
    await s.release(program)
    return None


def record_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
