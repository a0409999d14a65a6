"""Seeded bad and odd OpenAI request bodies for differential fuzzing (benchmarks/fuzz.py).

Each case is a small valid request (chat, completions or Responses, a handful of output
tokens so a served case costs the real CPU engine little) with one to three mutations drawn
from these families:

- `type`: a sampling field given a value of the wrong JSON type;
- `range`: a numeric field at or past the edge vLLM checks (`max_tokens` 0, 1.5, 10**30, ...);
- `unicode`: text, model names and ids with NUL, lone surrogates, RTL, zero-width, emoji;
- `nesting`: deep lists and objects where free-form JSON is allowed, and where it is not;
- `size`: long prompts, many messages, long ids and stop lists, bodies past the 8 MiB bound;
- `messages`: a message without a role, roles and content of every wrong type, bad parts;
- `shape`: a body that is not an object, not JSON, not UTF-8, or has the wrong content type;
- `context`: every agent-context convention malformed (`program_id`, `docker_ids`/`tool_ids`,
  `extra_body`, `nvext.agent_context` and `agent_hints`, `vllm_xargs.agentic_context`,
  LiteLLM's `metadata.session_id`, the Dynamo / LiteLLM / coding-agent session headers);
- `odd`: bodies vLLM serves although they look wrong (`"4"` as a count, `"on"` as a flag).

The same seed and index give the same case on every machine (one `random.Random` per case),
so a slice of a run is a slice of every other run with that seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "FAMILIES",
    "RESPONSES",
    "ROUTES",
    "FuzzCase",
    "generate",
    "make_case",
]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
ROUTES = (CHAT, COMPLETIONS, RESPONSES)

# Output-length fields of each route: the base body's is small, and mutations that leave a
# valid value leave a small one (a served case must not cost the CPU engine seconds).
_LIMIT_FIELD = {CHAT: "max_tokens", COMPLETIONS: "max_tokens", RESPONSES: "max_output_tokens"}

_WRONG_TYPES: list[Any] = [
    "x",
    "",
    " 3 ",
    "3",
    "true",
    "on",
    [1],
    [],
    {},
    {"a": 1},
    True,
    False,
    None,
    1.5,
    -1,
    0,
    10**30,
    1e308,
    [[[]]],
    "\u0000",
]
_SAMPLING_FIELDS = [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "stop_token_ids",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "user",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "priority",
    "request_id",
    "cache_salt",
    "response_format",
    "truncate_prompt_tokens",
    "bad_words",
    "allowed_token_ids",
    "model",
]
_ROUTE_FIELDS = {
    CHAT: [
        "max_tokens",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "echo",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
        "reasoning_effort",
        "documents",
        "parallel_tool_calls",
    ],
    COMPLETIONS: ["max_tokens", "prompt", "logprobs", "echo", "suffix"],
    RESPONSES: ["max_output_tokens", "input", "instructions", "store", "metadata", "top_logprobs"],
}
_RANGES: dict[str, list[Any]] = {
    "limit": [0, -1, 1.5, 2.0, "3", True, 10**30, 1e30, 2**63, 2**64, 99000, 200000, 2047, 4096],
    "temperature": [-1, -1e-9, 0, 0.0, 2, 2.0001, 1e308, -1e308],
    "top_p": [0, -0.1, 1, 1.0001, 1e-9],
    "top_k": [-2, -1, 0, 1, 2**63, 1.5, 2.0],
    "min_p": [-0.1, 0, 1, 1.1],
    "n": [0, -1, 1, 2, 16385, 1.5, 2**63],
    "presence_penalty": [-2.1, -2, 2, 2.1],
    "frequency_penalty": [-2.1, -2, 2, 2.1],
    "repetition_penalty": [0, -1, 1e-9, 1e308],
    "seed": [-(2**63) - 1, -(2**63), 2**63 - 1, 2**63, -1],
    "min_tokens": [-1, 0, 3, 5, 10**6, 1.5],
    "top_logprobs": [-2, -1, 0, 5, 21],
    "logprobs": [-2, -1, 0, 5, 21],
    "priority": [1, -1, 2**63],
    "truncate_prompt_tokens": [-2, -1, 0, 1, 2**63],
}
_ODD_TEXT = [
    "\u0000",
    "\ud800",  # a lone surrogate: valid JSON escape, not valid Unicode
    "\udfff\ud800",
    "\u202eevil\u202c",
    "\u200b\u200c\u200d\ufeff",
    "e\u0301\u0301\u0301\u0301",
    "\U0001f600" * 50,
    "\uffff\ufffe",
    "\x7f\x1b[31m",
    "caf\u00e9",
    "\u4e2d\u6587",
    "\\",
    '"',
    "</s><|im_end|><|endoftext|>",
]
_HEADERS = [
    "x-dynamo-session-id",
    "x-dynamo-parent-session-id",
    "x-dynamo-session-final",
    "x-dynamo-trajectory-id",
    "x-dynamo-parent-trajectory-id",
    "x-dynamo-trajectory-final",
    "x-litellm-session-id",
    "x-claude-code-session-id",
    "x-claude-code-agent-id",
    "x-claude-code-parent-agent-id",
    "session-id",
    "thread-id",
    "x-session-id",
    "x-parent-session-id",
    "x-smg-routing-key",
]
# Header values h11 will send (no CR, LF, NUL or other controls but tab; no white space at
# either end).
_HEADER_VALUES = [
    b"",
    b"s-1",
    b"caf\xc3\xa9",
    b"\xff\xfe",
    b"\xc3",
    b"true",
    b"yes",
    b"maybe",
    b"0",
    b"a\tb",
    b"x" * 9000,
    "\u202e".encode(),
    b"../../etc/passwd",
]


@dataclass(frozen=True)
class FuzzCase:
    """One generated request: where it goes, its exact bytes, and what made it."""

    index: int
    route: str
    body: bytes
    headers: tuple[tuple[str, bytes], ...] = ()
    content_type: str | None = "application/json"
    kinds: tuple[str, ...] = field(default_factory=tuple)

    def summary(self, limit: int = 300) -> dict[str, Any]:
        """A bounded, JSON-safe description for a report."""
        text = self.body[:limit].decode("utf-8", errors="backslashreplace")
        return {
            "index": self.index,
            "route": self.route,
            "kinds": list(self.kinds),
            "body_bytes": len(self.body),
            "body": text + ("..." if len(self.body) > limit else ""),
            "headers": {
                k: v[:80].decode("utf-8", errors="backslashreplace") for k, v in self.headers
            },
            "content_type": self.content_type,
        }


class _Draft:
    """A case being mutated: a body (JSON value, or raw bytes once a mutation broke it)."""

    def __init__(self, route: str, body: dict[str, Any]) -> None:
        self.route = route
        self.body: Any = body
        self.raw: bytes | None = None
        self.headers: list[tuple[str, bytes]] = []
        self.content_type: str | None = "application/json"
        self.kinds: list[str] = []
        # Text that replaces the string "\u0001nest\u0001" once the body is encoded: nesting
        # deeper than the encoder's own recursion limit.
        self.splice: str | None = None

    @property
    def obj(self) -> dict[str, Any] | None:
        return self.body if self.raw is None and isinstance(self.body, dict) else None


def _base(rng: random.Random, route: str, model: str) -> dict[str, Any]:
    words = " ".join(rng.choice(["agent", "tool", "run", "plan", "file", "test"]) for _ in range(6))
    limit = rng.randint(1, 4)
    if route == CHAT:
        return {
            "model": model,
            "messages": [{"role": "user", "content": words}],
            "max_tokens": limit,
        }
    if route == COMPLETIONS:
        return {"model": model, "prompt": words, "max_tokens": limit}
    return {"model": model, "input": words, "max_output_tokens": limit}


def _content_holder(draft: _Draft) -> tuple[dict[str, Any], str] | None:
    body = draft.obj
    if body is None:
        return None
    if draft.route == CHAT and isinstance(body.get("messages"), list) and body["messages"]:
        message = body["messages"][-1]
        return (message, "content") if isinstance(message, dict) else None
    key = "prompt" if draft.route == COMPLETIONS else "input"
    return (body, key) if key in body else None


def _m_type(rng: random.Random, d: _Draft) -> None:
    if (body := d.obj) is None:
        return
    name = rng.choice(_SAMPLING_FIELDS + _ROUTE_FIELDS[d.route])
    body[name] = rng.choice(_WRONG_TYPES)


def _m_range(rng: random.Random, d: _Draft) -> None:
    if (body := d.obj) is None:
        return
    name = rng.choice(list(_RANGES))
    key = _LIMIT_FIELD[d.route] if name == "limit" else name
    if d.route == CHAT and name == "limit" and rng.random() < 0.3:
        key = "max_completion_tokens"
    body[key] = rng.choice(_RANGES[name])
    if name == "top_logprobs" and rng.random() < 0.5:
        body["logprobs"] = True


def _m_unicode(rng: random.Random, d: _Draft) -> None:
    if (body := d.obj) is None:
        return
    text = "".join(rng.choice(_ODD_TEXT) for _ in range(rng.randint(1, 4)))
    where = rng.choice(["content", "content", "model", "stop", "user", "program_id", "key"])
    holder = _content_holder(d)
    if where == "content" and holder is not None:
        obj, key = holder
        obj[key] = (obj[key] if isinstance(obj[key], str) else "") + text
    elif where == "model":
        body["model"] = str(body.get("model", "")) + text
    elif where == "key":
        body[text] = text
    else:
        body[where] = text


_SPLICE = "\u0001nest\u0001"


def _nested(depth: int, leaf: Any, as_list: bool) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if as_list else {"a": value}
    return value


def _m_nesting(rng: random.Random, d: _Draft) -> None:
    if (body := d.obj) is None:
        return
    depth = rng.choice([2, 10, 100, 600, 3000])
    as_list = rng.random() < 0.5
    if depth > 500:
        opener, closer = ("[", "]") if as_list else ('{"a":', "}")
        d.splice = opener * depth + "1" + closer * depth
        value: Any = _SPLICE
    else:
        value = _nested(depth, rng.choice(["x", 1, None]), as_list)
    where = rng.choice(["metadata", "chat_template_kwargs", "extra", "content", "vllm_xargs"])
    holder = _content_holder(d)
    if where == "content" and holder is not None:
        holder[0][holder[1]] = value
    elif where == "vllm_xargs":
        body["vllm_xargs"] = {"x": value}
    else:
        body[where] = value


def _m_size(rng: random.Random, d: _Draft) -> None:
    if (body := d.obj) is None:
        return
    kind = rng.choice(["prompt", "prompt", "messages", "id", "stop", "huge"])
    holder = _content_holder(d)
    if kind == "prompt" and holder is not None:
        holder[0][holder[1]] = "word " * rng.choice([1500, 3000, 30_000, 200_000])
    elif kind == "messages" and d.route == CHAT:
        count = rng.choice([100, 3000])
        body["messages"] = [{"role": "user", "content": "hi"} for _ in range(count)]
    elif kind == "id":
        body[rng.choice(["program_id", "request_id", "user"])] = "p" * rng.choice([300, 70_000])
    elif kind == "stop":
        body["stop"] = ["s"] * rng.choice([4, 5, 1000])
    elif kind == "huge" and rng.random() < 0.05:  # past the gateway's 8 MiB body bound
        body["padding"] = "z" * (9 * 1024 * 1024)
    else:
        body["padding"] = "z" * 100_000


_BAD_MESSAGES: list[Any] = [
    "hi",
    ["hi"],
    [],
    {},
    None,
    [None],
    [{"content": "hi"}],
    [{"role": None, "content": "hi"}],
    [{"role": 5, "content": "hi"}],
    [{"role": "", "content": "hi"}],
    [{"role": "banana", "content": "hi"}],
    [{"role": "user", "content": 5}],
    [{"role": "user", "content": None}],
    [{"role": "assistant", "content": None}],
    [{"role": "user", "content": ["hi"]}],
    [{"role": "user", "content": [{"text": "hi"}]}],
    [{"role": "user", "content": [{"type": "text", "text": 5}]}],
    [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///x"}}]}],
    [{"role": "user", "content": []}],
    [{"role": "user", "content": "hi", "name": 5}],
    [{"role": "assistant", "content": "x", "tool_calls": "x"}],
    [{"role": "assistant", "content": "x", "tool_calls": [{"a": 1}]}],
    [{"role": "tool", "content": "x", "tool_call_id": 5}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}],
]


def _m_messages(rng: random.Random, d: _Draft) -> None:
    if (body := d.obj) is None:
        return
    if d.route == CHAT:
        body["messages"] = json.loads(json.dumps(rng.choice(_BAD_MESSAGES)))
    elif d.route == COMPLETIONS:
        body["prompt"] = rng.choice(
            [5, None, "", [], [-1], [2**40], [[1, 2], [3]], ["a", "b"], [1, "a"], {"a": 1}]
        )
    else:
        body["input"] = rng.choice(
            [5, None, "", [], [{"role": "user"}], [{"content": 5}], ["hi"], {"a": 1}]
        )


def _m_shape(rng: random.Random, d: _Draft) -> None:
    kind = rng.choice(["raw", "raw", "content_type", "route", "duplicate"])
    if kind == "raw":
        d.raw = rng.choice(
            [
                b"",
                b"{",
                b"[]",
                b"null",
                b"5",
                b'"x"',
                b'{"messages": [}',
                b'{"a": 1,}',
                b"\xff\xfe{}",
                b"\xef\xbb\xbf{}",
                b'{"temperature": NaN}',
                b'{"max_tokens": Infinity}',
                b'{"max_tokens": 1e999999}',
                b"{" * 5000,
            ]
        )
    elif kind == "content_type":
        d.content_type = rng.choice(
            [None, "text/plain", "application/x-www-form-urlencoded", "application/json; x=y"]
        )
    elif kind == "route":
        d.route = rng.choice([r for r in ROUTES if r != d.route])
    elif (body := d.obj) is not None:
        # Duplicate keys: the last one wins in Python's json (and in msgspec): a bad value
        # hidden behind a good one must not reach the engine as the good one.
        text = json.dumps(body)
        d.raw = (
            text[:-1] + ', "max_tokens": ' + rng.choice(['"x"', "4", "1.5", "-1"]) + "}"
        ).encode()


_PROGRAM_IDS: list[Any] = [
    5,
    None,
    "",
    " ",
    "p\u0000",
    "\ud800",
    "caf\u00e9",
    "a/b",
    ["p"],
    {"a": 1},
    True,
    1.5,
]
_CONTAINER_LISTS: list[Any] = [
    "sandbox-1",
    [5],
    [""],
    ["a b"],
    [["a"]],
    {"a": 1},
    ["x" * 300],
    [None],
    ["-x"],
    [f"c{i}" for i in range(1000)],
]
_NVEXT: list[Any] = [
    "x",
    [],
    {"agent_context": "x"},
    {"agent_context": {}},
    {"agent_context": {"trajectory_id": 5}},
    {"agent_context": {"trajectory_id": " "}},
    {"agent_context": {"trajectory_id": "t", "unknown": 1}},
    {"agent_context": {"trajectory_id": "t", "trajectory_final": "yes"}},
    {"agent_context": {"trajectory_id": "t", "session_id": 5}},
    {"agent_context": {"trajectory_id": "t", "parent_trajectory_id": ["p"]}},
    {"agent_hints": {"priority": "high"}},
    {"agent_hints": {"osl": -1}},
    {"agent_hints": {"strict_priority": 1.5}},
    {"agent_hints": {"speculative_prefill": "x"}},
    {"agent_hints": "x"},
    {"unknown": 1},
]
_XARGS: list[Any] = [
    "x",
    {"agentic_context": "x"},
    {"agentic_context": {"program_id": 5}},
    {"agentic_context": {"program_id": "p", "kv_retention_ttl_seconds": "x"}},
    {"agentic_context": {"program_id": "p", "kv_retention_ttl_seconds": -1}},
    {"agentic_context": {"program_id": "p", "kv_retention_ttl_seconds": 1e308}},
    {"agentic_context": {"program_id": "p", "priority": "x"}},
    {"agentic_context": {"program_id": "p", "deadline_seconds": -5}},
    {"agentic_context": {"program_id": "p", "expected_output_length": 1.5}},
    {"agentic_context": {}},
    {"a": {"b": 1}},
    {"a": 2**70},
]
_METADATA: list[Any] = [
    "x",
    5,
    [],
    {"session_id": 5},
    {"session_id": ""},
    {"session_id": None},
    {"session_id": ["a"]},
    {"session_id": "s" * 5000},
    {"session_id": "s", "other": {"deep": [1, 2]}},
]


def _m_context(rng: random.Random, d: _Draft) -> None:
    if (body := d.obj) is None:
        return
    kind = rng.choice(
        ["program_id", "containers", "extra_body", "nvext", "xargs", "metadata", "header",
         "header", "conflict"]
    )  # fmt: skip
    if kind == "program_id":
        body["program_id"] = rng.choice(_PROGRAM_IDS)
    elif kind == "containers":
        body[rng.choice(["docker_ids", "tool_ids"])] = rng.choice(_CONTAINER_LISTS)
        if rng.random() < 0.5:
            body["program_id"] = f"fuzz-{d.route[4:8]}-{rng.randrange(10**6)}"
    elif kind == "extra_body":
        body["extra_body"] = rng.choice(
            ["x", 5, [], {"program_id": 5}, {"program_id": "p", "docker_ids": "x"},
             {"extra_body": {"program_id": "p"}}, {"program_id": "p", "temperature": "hot"}]
        )  # fmt: skip
    elif kind == "nvext":
        body["nvext"] = json.loads(json.dumps(rng.choice(_NVEXT)))
    elif kind == "xargs":
        body["vllm_xargs"] = json.loads(json.dumps(rng.choice(_XARGS)))
    elif kind == "metadata":
        body["metadata"] = json.loads(json.dumps(rng.choice(_METADATA)))
    elif kind == "header":
        for _ in range(rng.randint(1, 3)):
            d.headers.append((rng.choice(_HEADERS), rng.choice(_HEADER_VALUES)))
    else:  # two conventions naming different programs
        body["program_id"] = "a"
        body["nvext"] = {"agent_context": {"trajectory_id": "b"}}


def _m_odd(rng: random.Random, d: _Draft) -> None:
    if (body := d.obj) is None:
        return
    body[rng.choice(["stream", "ignore_eos", "skip_special_tokens"])] = rng.choice(
        ["on", "off", "yes", "no", 1, 0, "true", "false", "t", "f"]
    )
    if rng.random() < 0.5:
        body[_LIMIT_FIELD[d.route]] = rng.choice(["3", True, 2.0, " 2 "])


_MUTATIONS: dict[str, Callable[[random.Random, _Draft], None]] = {
    "type": _m_type,
    "range": _m_range,
    "unicode": _m_unicode,
    "nesting": _m_nesting,
    "size": _m_size,
    "messages": _m_messages,
    "shape": _m_shape,
    "context": _m_context,
    "odd": _m_odd,
}
_WEIGHTS = {
    "type": 4,
    "range": 4,
    "unicode": 2,
    "nesting": 1,
    "size": 1,
    "messages": 3,
    "shape": 2,
    "context": 5,
    "odd": 2,
}
FAMILIES = tuple(_MUTATIONS)


def make_case(seed: int, index: int, model: str) -> FuzzCase:
    """The case `index` of the run seeded `seed` (the same on every machine)."""
    rng = random.Random(f"thunder-mw-fuzz:{seed}:{index}")
    route = rng.choices(ROUTES, weights=(6, 3, 2))[0]
    draft = _Draft(route, _base(rng, route, model))
    families = rng.choices(list(_WEIGHTS), weights=list(_WEIGHTS.values()), k=rng.randint(1, 3))
    for family in families:
        _MUTATIONS[family](rng, draft)
        draft.kinds.append(family)
    if draft.raw is not None:
        body = draft.raw
    else:
        # With ensure_ascii a lone surrogate is an escape (valid JSON, invalid Unicode);
        # without it, it is bytes that are not UTF-8.
        text = json.dumps(draft.body, ensure_ascii=rng.random() < 0.5)
        if draft.splice is not None:
            text = text.replace(json.dumps(_SPLICE), draft.splice)
        body = text.encode("utf-8", errors="surrogatepass")
    return FuzzCase(
        index=index,
        route=draft.route,
        body=body,
        headers=tuple(draft.headers),
        content_type=draft.content_type,
        kinds=tuple(draft.kinds),
    )


def generate(seed: int, count: int, model: str, start: int = 0) -> list[FuzzCase]:
    """Cases `start` .. `start + count - 1` of the run seeded `seed`."""
    return [make_case(seed, i, model) for i in range(start, start + count)]
