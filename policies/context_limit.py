"""Requests too large for every engine: refused at once, or handed to an engine unplanned.

Holding a request only makes sense when waiting can make room for it. One whose prompt plus
`max_tokens` exceeds the served model's `max_model_len` or the whole KV cache of every
engine that could take it would wait for room that never comes — and, at the head of the
queue, make the pause stage evict other programs for it. So it never enters the queue:

- **Certainly too large** (a lower bound on its size is past every engine's limit): refused
  with OpenAI's `context_length_exceeded` 400, naming the limit and the size, before the
  program table is touched — nobody is paused, nothing is reserved.
- **Past every `max_model_len` by the estimate only** (the point estimate is past, the lower
  bound is not): forwarded at once to the engine serving the longest model length,
  unplanned (no reservation, so no one is paused for it). The engine has the exact
  tokenizer: it answers its own 400, or runs the call if the estimate was high.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

__all__ = [
    "MAX_CHARS_PER_TOKEN",
    "PROMPT_FIELDS",
    "EngineLimits",
    "Refusal",
    "Unplanned",
    "check",
    "engine_limit",
    "prompt_chars_bound",
    "prompt_floor",
    "prompt_text_chars",
]

# Characters per token an estimate may never exceed when it must be a LOWER bound on the
# prompt's tokens. Ordinary BPE text averages ~4 characters a token (English, code) and the
# longest merges of common vocabularies (runs of spaces or of one character in Llama-3's and
# GPT-4's 100k-200k vocabularies) stay below 32; the JSON framing of a chat body only adds
# characters the template also turns into tokens. So `chars / 32` undercounts any real body.
MAX_CHARS_PER_TOKEN = 32


class EngineLimits(Protocol):
    """What the check reads of an engine (policies/core.py's BackendState)."""

    label: str
    capacity: int | None
    max_model_len: int | None


def engine_limit(engine: EngineLimits) -> tuple[int, str] | None:
    """The most tokens one request may take on `engine` (prompt + output) and which limit that
    is; None when the engine reports neither."""
    # The smaller of the two (a tie names the KV cache); per request, so without a list.
    length, kv = engine.max_model_len, engine.capacity
    if length and (not kv or length < kv):
        return length, "max_model_len"
    return (kv, "KV cache") if kv else None


# The fields of an OpenAI, vLLM or SGLang body whose text becomes prompt tokens (chat
# messages and tools through the chat template; completions' prompt and suffix; the
# Responses API's input and instructions; SGLang's /generate text and input_ids).
PROMPT_FIELDS = (
    "messages",
    "tools",
    "functions",
    "prompt",
    "suffix",
    "input",
    "instructions",
    "text",
    "input_ids",
)


def prompt_text_chars(data: dict[str, object]) -> int:
    """The characters of a body's prompt-bearing fields (a token id counts as the most
    characters a token may stand for, so it is one token of the floor): other fields — ids,
    metadata, sampling options — never make a request look too long."""
    total = 0
    stack: list[Any] = [data[name] for name in PROMPT_FIELDS if name in data]
    pop, extend = stack.pop, stack.extend
    # It runs on every request: exact-type tests first (what a JSON decoder builds; a bool is
    # not an int by type), isinstance only for other mappings' subclasses. A loop, not
    # recursion: a body may nest as deep as its decoder allows.
    while stack:
        item = pop()
        kind = type(item)
        if kind is str:
            total += len(item)
        elif kind is dict:
            extend(item.values())
        elif kind is list:
            extend(item)
        elif kind is int:
            total += MAX_CHARS_PER_TOKEN
        elif item is None or kind is bool or kind is float:
            continue
        elif isinstance(item, str):
            total += len(item)
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int):
            total += MAX_CHARS_PER_TOKEN
        elif isinstance(item, list):
            extend(item)
        elif isinstance(item, dict):
            extend(item.values())
    return total


def prompt_chars_bound(body_bytes: int) -> int:
    """The most `prompt_text_chars` a JSON body of `body_bytes` bytes can count: a string's
    characters are at most its encoded bytes, and an integer (MAX_CHARS_PER_TOKEN
    characters) takes at least a digit and the comma or bracket after it."""
    return body_bytes * (MAX_CHARS_PER_TOKEN // 2)


def prompt_floor(prompt_chars: int) -> int:
    """A lower bound on a body's prompt tokens (a chat template adds at least one)."""
    return max(1, prompt_chars // MAX_CHARS_PER_TOKEN) if prompt_chars > 0 else 0


class Refusal:
    """Refuse with OpenAI's context-length 400."""

    __slots__ = ("message", "param")

    def __init__(self, message: str, param: str) -> None:
        self.message, self.param = message, param


class Unplanned:
    """Forward to `backend` without a reservation: the engine decides."""

    __slots__ = ("backend",)

    def __init__(self, backend: str) -> None:
        self.backend = backend


def check(
    engines: Iterable[EngineLimits],
    prompt_chars: int,
    max_tokens: int | None,
    estimated_tokens: int,
) -> Refusal | Unplanned | None:
    """None: the request may fit somewhere (schedule it as usual). `prompt_chars`: the
    characters of its prompt-bearing fields (`prompt_text_chars`); `estimated_tokens`: the
    scheduler's point estimate of the request's footprint (prompt + output)."""
    best: tuple[int, str, str] | None = None
    longest: tuple[int, str] | None = None  # the longest max_model_len, and whose
    all_lengths_known = True
    for engine in engines:
        limit = engine_limit(engine)
        if limit is None:
            return None  # an engine whose limits are unknown might take it
        if best is None or limit[0] > best[0]:
            best = (limit[0], limit[1], engine.label)
        if engine.max_model_len is None:
            all_lengths_known = False
        elif longest is None or engine.max_model_len > longest[0]:
            longest = (engine.max_model_len, engine.label)
    if best is None:
        return None
    limit_tokens, kind, label = best
    prompt_min = prompt_floor(prompt_chars)
    output = max_tokens or 0
    floor = prompt_min + output
    if floor > limit_tokens:
        param = "max_tokens" if output >= limit_tokens else "messages"
        return Refusal(
            f"This request needs at least {floor} tokens ({prompt_min}+ in the messages, "
            f"{output} in the completion), more than any engine here can serve: the largest "
            f"limit is {limit_tokens} tokens ({kind} of {label}). Reduce the length of the "
            "messages or max_tokens.",
            param,
        )
    # Past every served model's length by the estimate: the engine, which counts exactly,
    # refuses it (or, if the estimate was high, serves it). Past the KV cache alone it is
    # scheduled as usual: it runs once an engine has room for it (policies/core.py `alone`).
    if all_lengths_known and longest is not None and estimated_tokens > longest[0]:
        return Unplanned(longest[1])
    return None
