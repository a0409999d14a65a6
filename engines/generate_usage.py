"""Token counts of SGLang's native `/generate` answers, for the scheduler.

SGLang reports them in `meta_info` (`prompt_tokens`, `completion_tokens`, `cached_tokens`),
once per answer, per prompt of a batch (a list), and in every streamed event with cumulative
counts (a batch's events carry `index`): the last event of each prompt holds its totals.
"""

from __future__ import annotations

import contextlib

import msgspec

from thunder_mw.policies.program_table import Usage

__all__ = ["StreamUsage", "usage_of_answer"]


class _Meta(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class _Answer(msgspec.Struct):
    meta_info: _Meta | None = None
    index: int = 0


_decode_one = msgspec.json.Decoder(_Answer).decode
_decode_many = msgspec.json.Decoder(list[_Answer]).decode
_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def _total(answers: list[_Answer]) -> Usage | None:
    metas = [a.meta_info for a in answers if a.meta_info is not None]
    if not metas:
        return None
    return Usage(
        prompt_tokens=sum(m.prompt_tokens for m in metas),
        completion_tokens=sum(m.completion_tokens for m in metas),
        cached_tokens=sum(m.cached_tokens for m in metas),
    )


def usage_of_answer(content: bytes) -> Usage | None:
    """The usage of a whole (non-streamed) `/generate` answer: one object or a batch list."""
    with contextlib.suppress(*_ERRORS):
        if content.lstrip()[:1] == b"[":
            return _total(_decode_many(content))
        return _total([_decode_one(content)])
    return None


class StreamUsage:
    """Follows a `/generate` stream's events; `usage` is the latest totals."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[int, _Answer] = {}

    def feed(self, event_data: bytes) -> None:
        with contextlib.suppress(*_ERRORS):
            answer = _decode_one(event_data)
            if answer.meta_info is not None:
                self._last[answer.index] = answer

    @property
    def usage(self) -> Usage | None:
        return _total(list(self._last.values()))
