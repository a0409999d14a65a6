"""The one way a test waits for something it can only observe by asking again.

A test that starts a thread, a process or a server often has no event to await: the effect
shows up in an API answer, a file or a counter. `wait_until` asks until the answer is truthy
and returns it; past the timeout it fails the test naming what it waited for (the caller's
`message`, or else the predicate's own source line) and the last answer it saw, so a hang
reads as a sentence, not as a bare "timed out".
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
Message = str | Callable[[], str] | None


def wait_until(
    predicate: Callable[[], T | None],
    timeout_s: float,
    *,
    interval_s: float = 0.05,
    message: Message = None,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """`predicate()`'s first truthy value, asked every `interval_s` for `timeout_s` at most
    (and once more at the deadline). Exceptions in `ignoring` count as "not yet"."""
    deadline = time.monotonic() + timeout_s
    while True:
        last_chance = time.monotonic() >= deadline
        last: object
        try:
            last = value = predicate()
        except ignoring as exc:
            last = exc
        else:
            if value:
                return value
        if last_chance:
            raise AssertionError(_timed_out(predicate, timeout_s, message, last))
        time.sleep(interval_s)


async def wait_until_async(
    predicate: Callable[[], Awaitable[T | None]],
    timeout_s: float,
    *,
    interval_s: float = 0.05,
    message: Message = None,
) -> T:
    """`wait_until` for a coroutine predicate, sleeping on the event loop between asks."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        last_chance = loop.time() >= deadline
        value = await predicate()
        if value:
            return value
        if last_chance:
            raise AssertionError(_timed_out(predicate, timeout_s, message, value))
        await asyncio.sleep(interval_s)


def _timed_out(
    predicate: Callable[..., object], timeout_s: float, message: Message, last: object
) -> str:
    what = (message() if callable(message) else message) or _describe(predicate)
    return f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})"


def _describe(predicate: Callable[..., object]) -> str:
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return getattr(predicate, "__qualname__", repr(predicate))
