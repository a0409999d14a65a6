"""Replay client: drives agent programs through any OpenAI-compatible URL, tool delays included.

Each program's calls go to `/v1/completions` with raw prompts (no chat template between the
client and the engine's prefix cache), the program id in the body as `extra_body` would put
it, `max_tokens` + `ignore_eos` so output lengths are fixed, and streaming with usage so the
time to first token and the engine's token counts are measured per call. A program's next
prompt is its previous prompt + the answer + what its tool returned (`growth_ids`), exactly
as benchmarks/des.py builds it, so a live run and a simulated run see the same reuse.
Times are scaled: with `time_scale` 10, a 5 s tool call sleeps 0.5 s of wall time.
Pooled connections are retired after 4 s idle (servers on uvicorn close them at 5 s), and a
request lost on a pooled connection the server closed anyway is sent once more on a fresh
one; a failed release is recorded, not raised, so a run's results survive its last request.
With `vocab_size` set (a real engine), prompts go as token-id lists and answers come back as
token ids (`return_token_ids`), so the engine sees exactly the ids the workload names and a
program's next prompt extends its last one token for token, whatever the model's tokenizer.
With `words` instead (a real engine behind a router that takes only text prompts, such as
SGLang's gateway), each id is sent as a word that is one token of the model's tokenizer on
its own and beside any other (`single_token_words`), so the engine still sees one token per id.
`identity` says how a target learns the program (thunder-mw's `program_id` by default; a
peer router's own body field or header instead), and `run(..., concurrency=C)` replays a
closed loop: at most C top-level programs at a time, the next starting when one ends.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from thunder_mw.benchmarks.workloads import ProgramSpec, growth_ids, system_ids
from thunder_mw.engines.pooled_connections import (
    KeepAliveConnector,
    forget_reuse,
    lost_on_a_reused_connection,
)

__all__ = [
    "CLIENT_KEEP_ALIVE_S",
    "CallRecord",
    "ClosedLoopQueue",
    "Identity",
    "ProgramRecord",
    "ReplayResult",
    "Replayer",
    "render",
    "run_until",
    "single_token_words",
    "thunder_identity",
]

# Below the 5 s after which uvicorn (vLLM, SGLang) closes an idle connection.
CLIENT_KEEP_ALIVE_S = 4.0

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"

# (program id, call index, is the program's last call) -> (body fields, headers)
Identity = Callable[[str, int, bool], tuple[dict[str, Any], dict[str, str]]]


def thunder_identity(
    program_id: str, index: int, last: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """thunder-mw's (and ThunderAgent's) convention: `program_id` in the body."""
    return {"program_id": program_id}, {}


def render(ids: Sequence[int]) -> str:
    """Token ids as text the simulator's rule tokenizer reads back one token per id
    (" xyz": a space and three word characters is one piece)."""
    words = []
    for i in ids:
        i %= 36**3
        words.append(" " + _DIGITS[i // 1296] + _DIGITS[i // 36 % 36] + _DIGITS[i % 36])
    return "".join(words)


@dataclass
class CallRecord:
    program_id: str
    index: int
    sent_at: float
    first_token_at: float | None = None
    done_at: float | None = None
    status: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class ProgramRecord:
    program_id: str
    top_level: bool
    arrived_at: float
    done_at: float | None = None
    failed: bool = False
    calls: list[CallRecord] = field(default_factory=list)
    release_error: str | None = None  # the release failed (the program's calls still count)


@dataclass
class ReplayResult:
    started_at: float
    finished_at: float
    programs: list[ProgramRecord]
    stale_retries: int = 0  # requests resent because the server had closed their connection


class ClosedLoopQueue:
    """A closed loop's programs, handed out in order; `emptied` is set as the last one is."""

    def __init__(self, programs: Sequence[ProgramSpec]) -> None:
        self._programs = iter(programs)
        self._left = len(programs)
        self.emptied = asyncio.Event()
        if not self._left:
            self.emptied.set()

    def next(self) -> ProgramSpec | None:
        spec = next(self._programs, None)
        if spec is not None:
            self._left -= 1
            if not self._left:
                self.emptied.set()
        return spec


async def run_until(runs: asyncio.Future[Any], event: asyncio.Event) -> None:
    """Await `runs` until `event` is set, then cancel what is left of them."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({runs, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        stopped = runs.cancel()  # False when they had ended by themselves
    try:
        await runs
    except asyncio.CancelledError:
        # A cancelled gather ends with CancelledError set as its exception (not cancelled()).
        if not stopped:
            raise


class Replayer:
    # Statuses after which a call is sent again (a client riding out a lost gateway), and
    # how often; none by default: a lost call is counted as lost.
    retry_statuses: frozenset[int] = frozenset()
    max_attempts = 1

    def __init__(
        self,
        url: str,
        *,
        model: str = "sim-model",
        time_scale: float = 1.0,
        release: bool = True,
        stream: bool = True,
        request_timeout_s: float = 600.0,
        vocab_size: int | None = None,
        progress: Callable[[Replayer], None] | None = None,
        identity: Identity = thunder_identity,
        words: Sequence[str] | None = None,
    ) -> None:
        """`stream=False` measures no time to first token but spares the client (and the
        gateway) a chunk per token: for runs whose point is throughput on a busy machine.
        `vocab_size`: send token ids (each workload id modulo it) instead of rendered text.
        `progress` is called after every call and every finished program."""
        self.url = url.rstrip("/")
        self.stream = stream
        self.model = model
        self.time_scale = time_scale
        self.release = release
        self.vocab_size = vocab_size
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._system: dict[str, str | list[int]] = {}
        self.records: list[ProgramRecord] = []
        self.done = 0
        self.calls_done = 0
        self.failed_calls = 0
        self.stale_retries = 0
        self.retries = 0
        self.started_at: float | None = None
        self.progress = progress
        self._fresh: aiohttp.ClientSession | None = None
        self.identity = identity
        self.words = words

    async def run(
        self,
        programs: list[ProgramSpec],
        concurrency: int | None = None,
        stop_at_last_start: bool = False,
    ) -> ReplayResult:
        """Every program, each at its `arrival_s`; with `concurrency`, a closed loop instead
        (arrival times ignored: a program starts when a slot frees). `stop_at_last_start`
        (closed loop): end the run when the last program starts, the end of the steady
        window (as the DES's `stop_at_window_end`); calls in flight then are dropped."""
        connector = KeepAliveConnector(keep_alive_s=CLIENT_KEEP_ALIVE_S, limit=0)
        started = self.started_at = time.monotonic()
        async with (
            aiohttp.ClientSession(connector=connector, timeout=self.timeout) as session,
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True), timeout=self.timeout
            ) as fresh,
        ):
            self._fresh = fresh
            if concurrency is None:
                await asyncio.gather(*(self._program(session, spec, started) for spec in programs))
            else:
                queue = ClosedLoopQueue(programs)
                runs = asyncio.gather(
                    *(self._loop(session, queue, started) for _ in range(concurrency))
                )
                if stop_at_last_start:
                    await run_until(runs, queue.emptied)
                else:
                    await runs
        return self.partial_result()

    def partial_result(self) -> ReplayResult:
        """What the run recorded so far (all of it once `run` returned)."""
        started = self.started_at if self.started_at is not None else time.monotonic()
        return ReplayResult(started, time.monotonic(), self.records, self.stale_retries)

    async def _post(
        self,
        session: aiohttp.ClientSession,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        """POST, and once more on a fresh connection when the pooled one it went out on turned
        out closed by the server (which then saw nothing of it)."""
        forget_reuse()
        try:
            return await session.post(url, json=body, headers=headers)
        except (aiohttp.ClientError, OSError) as exc:
            if self._fresh is None or not lost_on_a_reused_connection(exc):
                raise
            self.stale_retries += 1
            return await self._fresh.post(url, json=body, headers=headers)

    async def _loop(
        self, session: aiohttp.ClientSession, queue: ClosedLoopQueue, t0: float
    ) -> None:
        while (spec := queue.next()) is not None:
            await self._program(session, spec, t0, closed=True)

    async def _sleep(self, sim_s: float) -> None:
        if sim_s > 0:
            await asyncio.sleep(sim_s / self.time_scale)

    def _encode(self, ids: Sequence[int]) -> str | list[int]:
        if self.words is not None:
            return "".join(self.words[i % len(self.words)] for i in ids)
        if self.vocab_size is None:
            return render(ids)
        return [i % self.vocab_size for i in ids]

    def _system_prompt(self, spec: ProgramSpec) -> str | list[int]:
        key = f"{spec.session_type}:{spec.system_tokens}"
        if key not in self._system:
            self._system[key] = self._encode(system_ids(spec.session_type, spec.system_tokens))
        return self._system[key]

    async def _program(
        self, session: aiohttp.ClientSession, spec: ProgramSpec, t0: float, closed: bool = False
    ) -> None:
        if not closed:
            await self._sleep(spec.arrival_s)
        record = ProgramRecord(spec.program_id, spec.parent_id is None, time.monotonic())
        self.records.append(record)
        await self._sleep(spec.start_s)
        prompt: Any = ""
        for index, call in enumerate(spec.calls):
            growth = self._encode(growth_ids(spec.program_id, index, call.growth_tokens))
            prompt = (
                self._system_prompt(spec) + growth  # type: ignore[operator]
                if index == 0 or call.reset
                else prompt + growth
            )
            last = index == len(spec.calls) - 1
            result = await self._call(
                session, spec.program_id, index, prompt, call.output_tokens, last
            )
            record.calls.append(result[0])
            self.calls_done += 1
            if result[0].status != 200:
                self.failed_calls += 1
                record.failed = True
                self._report()
                break
            self._report()
            prompt += result[1]
            waits = [self._sleep(call.tool_s)]
            waits += [self._program(session, sub, t0) for sub in call.subagents]
            await asyncio.gather(*waits)
        record.done_at = time.monotonic()
        if self.release:
            try:
                url = f"{self.url}/programs/release"
                async with await self._post(session, url, {"program_id": spec.program_id}) as r:
                    await r.read()
                    if r.status != 200:
                        record.release_error = f"status {r.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                record.release_error = repr(exc)
        self.done += 1
        self._report()

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self)

    async def _call(
        self,
        session: aiohttp.ClientSession,
        program_id: str,
        index: int,
        prompt: str | list[int],
        output_tokens: int,
        last: bool = False,
    ) -> tuple[CallRecord, Any]:
        fields, headers = self.identity(program_id, index, last)
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": output_tokens,
            "ignore_eos": True,
            **fields,
        }
        if self.vocab_size is not None and self.words is None:
            body["return_token_ids"] = True
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        for _ in range(self.max_attempts - 1):
            record, answer = await self._attempt(session, program_id, index, body, headers)
            if record.status not in self.retry_statuses:
                return record, answer
            self.retries += 1
            await asyncio.sleep(0.2)
        return await self._attempt(session, program_id, index, body, headers)

    async def _attempt(
        self,
        session: aiohttp.ClientSession,
        program_id: str,
        index: int,
        body: dict[str, Any],
        headers: dict[str, str],
    ) -> tuple[CallRecord, Any]:
        record = CallRecord(program_id, index, time.monotonic())
        text: list[Any] = []
        try:
            url = f"{self.url}/v1/completions"
            async with await self._post(session, url, body, headers) as r:
                record.status = r.status
                if r.status != 200:
                    await r.read()
                    return record, self._joined(text)
                if not self.stream:
                    self._whole(await r.json(), record, text)
                    record.done_at = time.monotonic()
                    return record, self._joined(text)
                buffer = b""
                async for chunk in r.content.iter_any():
                    buffer += chunk
                    *events, buffer = buffer.split(b"\n\n")
                    for event in events:
                        self._event(event, record, text)
        except (aiohttp.ClientError, TimeoutError):
            record.status = 599
        record.done_at = time.monotonic()
        return record, self._joined(text)

    def _joined(self, pieces: list[Any]) -> str | list[int]:
        if self.vocab_size is None or self.words is not None:
            return "".join(pieces)
        return [i for piece in pieces for i in piece]

    @classmethod
    def _event(cls, event: bytes, record: CallRecord, text: list[str]) -> None:
        if not event.startswith(b"data: ") or event == b"data: [DONE]":
            return
        cls._whole(json.loads(event[6:]), record, text)

    @staticmethod
    def _whole(data: dict[str, Any], record: CallRecord, text: list[str]) -> None:
        if "error" in data:
            record.status = 502
            return
        for choice in data.get("choices") or ():
            # With return_token_ids the answer is its ids (text need not re-tokenize the same).
            ids = choice.get("token_ids")
            piece = ids if ids is not None else choice.get("text")
            if piece:
                if record.first_token_at is None:
                    record.first_token_at = time.monotonic()
                text.append(piece)
        usage = data.get("usage")
        if usage:
            record.prompt_tokens = usage.get("prompt_tokens", 0)
            record.completion_tokens = usage.get("completion_tokens", 0)
            details = usage.get("prompt_tokens_details") or {}
            record.cached_tokens = details.get("cached_tokens") or 0


def single_token_words(tokenizer_json: str) -> list[str]:
    """The vocabulary's space-led alphabetic tokens that encode back to themselves alone: any
    concatenation of them is one token per word (a byte-level BPE splits at each space)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_json)
    words = []
    for token, i in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        body = token[1:]
        if token.startswith("\u0120") and body.isascii() and body.isalpha():
            text = tokenizer.decode([i])
            if tokenizer.encode(text, add_special_tokens=False).ids == [i]:
                words.append(text)
    return words
