"""Speculative prefill, live: remembers programs' last prompts and answers, sends warming requests.

The `speculative_prefill` stage (policies/speculative_prefill.py) decides when an engine
should be warmed with a program's context and emits `Prefill(program, backend)`. This module
carries it out: the forwarder records each call's answer (JSON or SSE, `AnswerRecorder`)
and keeps the program's last request body and answer (`PromptMemory`, an LRU bounded by a
byte budget); `SpeculativePrefiller`, a listener of the scheduler's actions, sends the
engine that body with the answer appended as an assistant turn and `max_tokens: 1`, on a
task of its own: the event loop never waits for it, and its failures are logged and counted
but reach no client. Its tokens are in no client's usage: it never passes through the call
path (CallState, report_usage, profiles' steps).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from thunder_mw.engines.client import STREAM_ERRORS, UpstreamError
from thunder_mw.engines.pool import BackendPool
from thunder_mw.observability.prefill_metrics import PrefillMetrics
from thunder_mw.policies.core import Action, Prefill, Released, SchedulerCore
from thunder_mw.policies.speculative_prefill import SpeculativePrefill
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import SpeculativePrefillSettings

__all__ = [
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "WARMABLE_PATHS",
    "AnswerRecorder",
    "PromptMemory",
    "Remembered",
    "SpeculativePrefiller",
    "warming_body",
]

log = logging.getLogger("thunder_mw.speculative_prefill")

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
WARMABLE_PATHS = frozenset({CHAT_PATH, COMPLETIONS_PATH})
# Request keys that shape the answer, not the prompt: the warming request sets its own.
_ANSWER_KEYS = (
    "stream",
    "stream_options",
    "n",
    "best_of",
    "logprobs",
    "top_logprobs",
    "max_completion_tokens",
    "min_tokens",
    "ignore_eos",
    "echo",
    "suffix",
)


# ---------------------------------------------------------------- the answer of one call
class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    type: str | None = None
    function: _Function | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    message: _Message | None = None
    delta: _Message | None = None
    text: str | None = None


class _Answer(msgspec.Struct):
    choices: list[_Choice] | None = None


_decode_answer = msgspec.json.Decoder(_Answer).decode
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


class AnswerRecorder:
    """The first choice's text and tool calls of one answer, whole (JSON) or event by event
    (SSE). Stops recording, and says so, once the answer outgrows `limit` bytes."""

    __slots__ = ("limit", "overflow", "size", "text", "tools")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.text: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.size = 0
        self.overflow = False

    def feed_json(self, content: bytes) -> None:
        with contextlib.suppress(*_DECODE_ERRORS):
            self._take(_decode_answer(content), whole=True)

    def feed_events(self, ready: bytes) -> None:
        """Complete SSE events (as the forwarder relays them): their `data:` payloads."""
        if self.overflow:
            return
        for event in ready.split(b"\n\n"):
            start = event.find(b"data: {")
            if start < 0:
                continue
            with contextlib.suppress(*_DECODE_ERRORS):
                self._take(_decode_answer(event[start + 6 :]), whole=False)

    def _take(self, answer: _Answer, whole: bool) -> None:
        for choice in answer.choices or ():
            if choice.index != 0:
                continue
            part = choice.message if whole else choice.delta
            text = choice.text if part is None else part.content
            if text:
                self._grow(len(text))
                self.text.append(text)
            for position, call in enumerate((part.tool_calls if part else None) or ()):
                self._tool(position if whole or call.index is None else call.index, call)

    def _tool(self, index: int, call: _ToolCall) -> None:
        entry = self.tools.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if call.id:
            entry["id"] = call.id
        if call.type:
            entry["type"] = call.type
        if call.function is not None:
            fn = entry["function"]
            for key in ("name", "arguments"):
                piece = getattr(call.function, key)
                if piece:
                    self._grow(len(piece))
                    fn[key] += piece

    def _grow(self, n: int) -> None:
        self.size += n
        if self.size > self.limit:
            self.overflow = True

    def message(self) -> dict[str, Any]:
        """The answer as the assistant turn a client would send back."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
        if self.tools:
            message["tool_calls"] = [self.tools[i] for i in sorted(self.tools)]
        return message


# ---------------------------------------------------------------- what is remembered
class Remembered(msgspec.Struct):
    """A program's last request (its route and body) and the answer to it, `size` bytes."""

    path: str
    body: dict[str, Any]
    answer: dict[str, Any]
    size: int


class PromptMemory:
    """Each program's last request body and answer, least recently stored first dropped once
    their bytes (the body's encoded length plus the answer's text) pass `budget`."""

    def __init__(self, budget: int, metrics: PrefillMetrics | None = None) -> None:
        self.budget = budget
        self.metrics = metrics
        self._programs: collections.OrderedDict[str, Remembered] = collections.OrderedDict()
        self.bytes_held = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._programs)

    def recorder(self, path: str) -> AnswerRecorder | None:
        """A recorder for a call on `path`, when such calls can be warmed and fit at all."""
        if path not in WARMABLE_PATHS or self.budget <= 0:
            return None
        return AnswerRecorder(self.budget)

    def store(
        self,
        program_id: str,
        path: str,
        body: dict[str, Any],
        body_bytes: int,
        answer: AnswerRecorder,
    ) -> None:
        if answer.overflow:
            self.forget(program_id)  # its last prompt no longer fits: an older one would mislead
            return
        size = body_bytes + answer.size
        self.forget(program_id)
        if size > self.budget:
            return
        self._programs[program_id] = Remembered(path, body, answer.message(), size)
        self.bytes_held += size
        while self.bytes_held > self.budget:
            _, dropped = self._programs.popitem(last=False)
            self.bytes_held -= dropped.size
            self.evictions += 1
            if self.metrics is not None:
                self.metrics.evictions.inc()

    def get(self, program_id: str) -> Remembered | None:
        return self._programs.get(program_id)

    def forget(self, program_id: str) -> None:
        old = self._programs.pop(program_id, None)
        if old is not None:
            self.bytes_held -= old.size


def warming_body(remembered: Remembered) -> dict[str, Any] | None:
    """The program's last request with its answer appended, asking for one token; None when
    its route or prompt cannot be extended (a prompt of token ids, several prompts)."""
    body = {k: v for k, v in remembered.body.items() if k not in _ANSWER_KEYS}
    body["max_tokens"] = 1
    if remembered.path == CHAT_PATH:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        body["messages"] = [*messages, remembered.answer]
        return body
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return None
    body["prompt"] = prompt + (remembered.answer.get("content") or "")
    return body


# ---------------------------------------------------------------- carrying out Prefill
class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    prompt_tokens_details: dict[str, Any] | None = None


class _Answered(msgspec.Struct):
    usage: _Usage | None = None


_decode_answered = msgspec.json.Decoder(_Answered).decode
_encode = msgspec.json.Encoder().encode


class SpeculativePrefiller:
    """Listens to the scheduler's actions: sends `Prefill`s, forgets released programs."""

    @classmethod
    def for_core(
        cls,
        core: SchedulerCore,
        pool: BackendPool,
        settings: SpeculativePrefillSettings,
        metrics: PrefillMetrics,
    ) -> SpeculativePrefiller | None:
        """One for a pipeline with a `speculative_prefill` stage (else None: nothing to do)."""
        stage = next((s for s in core.pipeline() if isinstance(s, SpeculativePrefill)), None)
        if stage is None:
            return None

        def enabled_for(ctx: AgentContext) -> bool:
            # The request's hint, else the one its program sent before, else the default.
            hint = ctx.speculative_prefill
            if hint is None:
                hint = core.speculative_prefill_hint(ctx.program_id)
            return stage.params.default if hint is None else hint

        return cls(pool, settings, metrics, enabled_for)

    def __init__(
        self,
        pool: BackendPool,
        settings: SpeculativePrefillSettings,
        metrics: PrefillMetrics,
        enabled_for: Callable[[AgentContext], bool] | None = None,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.metrics = metrics
        self.memory = PromptMemory(settings.memory_bytes, metrics)
        metrics.watch(lambda: self.memory.bytes_held, lambda: len(self.memory))
        # Which programs' answers are worth remembering (the stage's `wants`, by context).
        self.enabled_for = enabled_for
        self._tasks: set[asyncio.Task[None]] = set()

    def wants(self, ctx: AgentContext | None) -> bool:
        return ctx is not None and self.enabled_for is not None and self.enabled_for(ctx)

    def on_action(self, action: Action) -> None:
        if isinstance(action, Prefill):
            try:
                task = asyncio.get_running_loop().create_task(self._warm(action))
            except RuntimeError:  # no loop (a core driven outside the gateway): nothing to send
                return
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif isinstance(action, Released):
            self.memory.forget(action.program_id)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def idle(self) -> None:
        """Returns once no warming request is in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _warm(self, action: Prefill) -> None:
        outcome = "failed"
        try:
            outcome = await asyncio.wait_for(self._send(action), self.settings.timeout_s)
        except TimeoutError:
            outcome = "timeout"
        except Exception:  # never a client's problem: logged and counted
            log.warning(
                "speculative prefill of %s on %s failed",
                action.program_id,
                action.backend,
                exc_info=True,
            )
        self.metrics.prefills.labels(action.backend, outcome).inc()
        log.debug("speculative prefill of %s on %s: %s", action.program_id, action.backend, outcome)

    async def _send(self, action: Prefill) -> str:
        remembered = self.memory.get(action.program_id)
        if remembered is None:
            return "no_prompt"
        body = warming_body(remembered)
        if body is None:
            return "unsupported"
        backend = self.pool.get(action.backend)
        if backend is None or backend.engine is None or not backend.healthy:
            return "no_backend"
        payload = _encode(body)
        headers = [
            (b"content-type", b"application/json"),
            (b"accept-encoding", b"identity"),
            (b"content-length", str(len(payload)).encode()),
        ]
        if backend.auth_header is not None:
            headers.append(backend.auth_header)
        try:
            response = await backend.engine.send("POST", remembered.path, headers, payload)
        except UpstreamError as exc:
            log.info("speculative prefill of %s on %s: %s", action.program_id, backend.label, exc)
            return "timeout" if exc.timeout else "failed"
        try:
            content = await response.read()
        except (UpstreamError, *STREAM_ERRORS) as exc:
            log.info("speculative prefill of %s on %s: %s", action.program_id, backend.label, exc)
            return "failed"
        finally:
            response.close()
        if response.status >= 400:
            log.info(
                "speculative prefill of %s on %s: HTTP %d %s",
                action.program_id,
                backend.label,
                response.status,
                content[:200],
            )
            return "http_error"
        with contextlib.suppress(*_DECODE_ERRORS):
            usage = _decode_answered(content).usage
            if usage is not None:
                cached = (usage.prompt_tokens_details or {}).get("cached_tokens") or 0
                self.metrics.tokens.labels(backend.label, "prompt").inc(usage.prompt_tokens)
                if isinstance(cached, int):
                    self.metrics.tokens.labels(backend.label, "cached").inc(cached)
        return "ok"
