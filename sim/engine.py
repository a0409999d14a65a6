"""A pure model of vLLM v1's scheduler and KV cache, stepped by its caller (no I/O, no clock).

Each `step()` does what one vLLM engine step does (vllm/v1/core/sched/scheduler.py, 0.32):
1. running requests first, oldest first: a decoding request gets one token; a request in
   chunked prefill gets its next chunk. One that needs a block when none is free preempts
   the newest running request (recompute preemption: its blocks are freed, it re-queues at
   the head of the waiting queue with its output so far as part of its prompt);
2. only if nothing was preempted, waiting requests in order, while the token budget lasts
   and fewer than max_num_seqs run: the longest cached prefix is reused (full blocks only,
   never the last token), the rest prefilled, chunked to the budget; admission needs room
   for the whole sequence so far (vLLM's scheduler_reserve_full_isl);
3. the step's duration comes from the cost model; finished requests free their blocks.

Decoding requests are advanced lazily: per step only requests that cross a block boundary
or finish are touched, so a step with hundreds of running requests costs microseconds.
"""

from __future__ import annotations

import enum
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from thunder_mw.sim.cost_model import StepCost, get_profile
from thunder_mw.sim.kv_cache import ROOT_HASH, BlockHash, BlockPool


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


class Listener(Protocol):
    """Told about a request's progress at the end of each step it produced tokens in."""

    def on_progress(self, seq: Sequence) -> None: ...

    def on_finish(self, seq: Sequence) -> None: ...


@dataclass(frozen=True, slots=True)
class EngineConfig:
    num_blocks: int = 2048
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    profile: str = "h100-8b"
    seed: int = 0


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False


class Sequence:
    """One request inside the engine."""

    __slots__ = (
        "_alloc_at",
        "_finish_at",
        "_k0",
        "_o0",
        "block_hashes",
        "blocks",
        "decoding",
        "finish_reason",
        "finish_step",
        "listener",
        "num_cached_blocks",
        "num_cached_tokens",
        "num_computed",
        "num_output",
        "num_preemptions",
        "prompt",
        "prompt_len",
        "request_id",
        "run_no",
        "status",
        "stop_reason",
        "stream",
        "target",
        "user_data",
    )

    def __init__(
        self,
        request_id: str,
        prompt: list[int],
        target: int,
        stop_reason: str,
        listener: Any = None,
        stream: bool = False,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_len = len(prompt)
        self.target = target  # output tokens it will produce
        self.stop_reason = stop_reason  # "length" (max_tokens) or "stop" (EOS)
        self.listener = listener
        self.stream = stream
        self.status = Status.WAITING
        self.blocks: list[int] = []
        self.block_hashes: list[BlockHash] = []
        self.num_cached_blocks = 0
        self.num_computed = 0
        self.num_output = 0
        self.num_cached_tokens = -1  # prefix hit at first admission, reported in usage
        self.num_preemptions = 0
        self.run_no = -1
        self.decoding = False
        self.finish_reason: str | None = None
        self.finish_step = -1
        self.user_data: Any = None  # the caller's (the HTTP server keeps its request here)
        # Lazy decode state: after step s, computed = _k0 + s and output = _o0 + s.
        self._k0 = 0
        self._o0 = 0
        # Steps of its pending events; an event whose step no longer matches is stale.
        self._alloc_at = -1
        self._finish_at = -1

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output


@dataclass(slots=True)
class EngineStats:
    """Counters with the meaning of vLLM's Prometheus counters (tokens, not blocks)."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preempted_prefix_cache_queries: int = 0
    preempted_prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    requests_finished: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    busy_seconds: float = 0.0


@dataclass(slots=True)
class StepResult:
    duration: float
    prefill_tokens: int
    decode_seqs: int
    decode_context: int
    finished: list[Sequence]
    progressed: list[Sequence]
    preempted: int


class Engine:
    """The simulated engine. Call `add_request`, then `step()` until `has_work` is False."""

    def __init__(
        self,
        config: EngineConfig,
        filler_ids: list[int],
        cost: StepCost | None = None,
    ) -> None:
        self.config = config
        self.cost = cost or get_profile(config.profile)
        self.pool = BlockPool(config.num_blocks, config.block_size)
        self.stats = EngineStats()
        self.now = 0.0  # simulated seconds spent in steps
        self.step_no = 0
        self._filler = filler_ids or [0]
        m = len(self._filler)
        bs = config.block_size
        reps = self._filler * (bs // m + 2)
        # Output tokens are filler[j % m]; a block wholly inside the output is one of these.
        self._filler_blocks = [tuple(reps[o : o + bs]) for o in range(m)]
        self._waiting: deque[Sequence] = deque()
        self._running: dict[int, Sequence] = {}  # run_no -> seq, in running order
        self._prefilling: dict[int, Sequence] = {}  # running, prompt not fully computed
        self._streams: dict[int, Sequence] = {}  # running decoders whose listener wants tokens
        self._alloc_events: dict[int, list[Sequence]] = {}
        self._finish_events: dict[int, list[Sequence]] = {}
        self._next_run_no = 0
        self._n_decoding = 0
        self._sum_k0 = 0  # Σ _k0 over decoding sequences
        self._by_id: dict[str, Sequence] = {}

    # -- public API ------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_usable * self.config.block_size

    def target_length(self, prompt: list[int], params: SamplingParams) -> tuple[int, str]:
        """How many tokens a request will generate and why it stops: max_tokens with
        ignore_eos, else a deterministic 'natural' length (where the model would emit EOS),
        kept within [min_tokens, max_tokens]."""
        limit = params.max_tokens
        if limit is None:
            limit = self.config.max_model_len - len(prompt)
        limit = max(1, limit)
        if params.ignore_eos:
            return limit, "length"
        key = repr((self.config.seed, len(prompt), prompt[-8:])).encode()
        natural = max(16 + zlib.crc32(key) % 241, params.min_tokens)
        if natural >= limit:
            return limit, "length"
        return max(1, natural), "stop"

    def validate(self, prompt: list[int], params: SamplingParams) -> str | None:
        """An error message for a request the engine cannot serve, like vLLM's 400s."""
        n = len(prompt)
        if n == 0:
            return "The prompt is empty"
        max_len = self.config.max_model_len
        want = n + (params.max_tokens or 1)
        if n >= max_len or (params.max_tokens is not None and want > max_len):
            return (
                f"This model's maximum context length is {max_len} tokens. However, you "
                f"requested {want} tokens ({n} in the messages, {params.max_tokens or 0} in "
                "the completion). Please reduce the length of the messages or completion."
            )
        if want > self.capacity_tokens:
            return (
                f"The request needs {want} tokens of KV cache but the engine holds only "
                f"{self.capacity_tokens}"
            )
        return None

    def add_request(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams | None = None,
        listener: Listener | None = None,
        stream: bool = False,
    ) -> Sequence:
        target, reason = self.target_length(prompt, params or SamplingParams())
        seq = Sequence(request_id, prompt, target, reason, listener, stream)
        self._waiting.append(seq)
        self._by_id[request_id] = seq
        return seq

    def abort(self, request_id: str) -> bool:
        """Drop a request (client went away); its blocks are freed like a finished one's."""
        seq = self._by_id.pop(request_id, None)
        if seq is None or seq.status in (Status.FINISHED, Status.ABORTED):
            return False
        if seq.status is Status.WAITING:
            self._waiting.remove(seq)
        else:
            self._leave_running(seq, self.step_no)
            self._cache_full_blocks(seq, seq.num_computed)
            self.pool.free(reversed(seq.blocks))
            seq.blocks = []
        seq.status = Status.ABORTED
        seq.finish_reason = "abort"
        self.stats.requests_finished["abort"] = self.stats.requests_finished.get("abort", 0) + 1
        return True

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def step(self) -> StepResult | None:
        """Run one engine step; None when there is nothing to do."""
        if not self._running and not self._waiting:
            return None
        self.step_no += 1
        s = self.step_no
        bs = self.config.block_size
        budget = self.config.max_num_batched_tokens
        pool = self.pool
        preempted = 0

        # 1. Running requests. Decoders not crossing a block boundary need nothing: they
        #    are counted, not visited.
        budget -= self._n_decoding
        alloc_events = self._alloc_events
        special = alloc_events.pop(s, None) or []
        if self._prefilling:
            special.extend(self._prefilling.values())
        # Order matters only when blocks may run out (who preempts whom).
        if len(special) > 1 and (self._prefilling or pool.num_free < len(special)):
            special.sort(key=_run_order)
        scheduled_prefill: list[tuple[Sequence, int]] = []
        for seq in special:
            if seq.decoding:
                if seq._alloc_at != s:
                    continue  # stale event, or preempted earlier in this step
                while not pool.num_free:
                    victim = self._running[next(reversed(self._running))]
                    self._preempt(victim, s - 1)
                    preempted += 1
                    if victim is seq:
                        break
                if not seq.decoding:
                    continue
                # Its blocks are all full now. Their hashes are registered when it stops
                # running: no other request can hold its unseen output in a prompt before.
                seq.blocks.append(pool.allocate_one())
                nxt = s + bs
                if nxt <= seq._finish_at:
                    seq._alloc_at = nxt
                    lst = alloc_events.get(nxt)
                    if lst is None:
                        alloc_events[nxt] = [seq]
                    else:
                        lst.append(seq)
                else:
                    seq._alloc_at = -1
                continue
            if seq.status is not Status.RUNNING or budget <= 0:
                continue
            num_new = min(seq.num_tokens - seq.num_computed, budget)
            need = -(-(seq.num_computed + num_new) // bs) - len(seq.blocks)
            ok = True
            while need > pool.num_free:
                victim = self._running[next(reversed(self._running))]
                self._preempt(victim, s - 1)
                preempted += 1
                if victim is seq:
                    ok = False
                    break
            if not ok:
                continue
            if need > 0:
                seq.blocks.extend(pool.allocate(need))
            self._cache_full_blocks(seq, seq.num_computed + num_new)
            scheduled_prefill.append((seq, num_new))
            budget -= num_new
        if preempted:
            # Preempted decoders were counted before they left; give their tokens back.
            budget = self.config.max_num_batched_tokens - self._n_decoding
            budget -= sum(n for _, n in scheduled_prefill)

        # 2. Waiting requests, only in a step that preempted nothing.
        if not preempted:
            max_seqs = self.config.max_num_seqs
            waiting = self._waiting
            while budget > 0 and waiting and len(self._running) < max_seqs:
                seq = waiting[0]
                num_new = self._admit(seq, budget)
                if num_new == 0:
                    break
                waiting.popleft()
                seq.status = Status.RUNNING
                seq.run_no = self._next_run_no
                self._next_run_no += 1
                self._running[seq.run_no] = seq
                self._prefilling[seq.run_no] = seq
                scheduled_prefill.append((seq, num_new))
                budget -= num_new

        # 3. The forward pass.
        n_dec = self._n_decoding
        ctx = self._sum_k0 + n_dec * s  # Σ (computed before this step + 1)
        prefill_tokens = sum(n for _, n in scheduled_prefill)
        duration = self.cost.step_seconds(prefill_tokens, n_dec, ctx)
        self.now += duration
        st = self.stats
        st.steps += 1
        st.busy_seconds += duration
        st.generation_tokens += n_dec
        finished: list[Sequence] = []
        progressed: list[Sequence] = []
        for seq, num_new in scheduled_prefill:
            seq.num_computed += num_new
            if seq.num_computed < seq.num_tokens:
                continue  # more chunks to go
            del self._prefilling[seq.run_no]
            if seq.num_preemptions == 0 and seq.num_output == 0:
                st.prompt_tokens += seq.prompt_len
                st.prompt_tokens_cached += max(seq.num_cached_tokens, 0)
            seq.num_output += 1
            st.generation_tokens += 1
            if seq.num_output >= seq.target:
                self._finish(seq, s, finished)
            else:
                self._enter_decode(seq, s)
                if seq.listener is not None:
                    progressed.append(seq)
        events = self._finish_events.pop(s, None)
        if events:
            for seq in events:
                if seq.decoding and seq._finish_at == s:
                    self._finish(seq, s, finished)
        if self._streams:
            for seq in self._streams.values():
                self._materialize(seq, s)
                progressed.append(seq)
        for seq in progressed:
            seq.listener.on_progress(seq)
        for seq in finished:
            if seq.listener is not None:
                seq.listener.on_finish(seq)
        return StepResult(duration, prefill_tokens, n_dec, ctx, finished, progressed, preempted)

    def run_until_idle(self, max_steps: int = 10_000_000) -> int:
        """Step until no request is left; returns the number of steps taken."""
        n = 0
        while self.has_work and n < max_steps:
            self.step()
            n += 1
        return n

    def snapshot(self) -> dict[str, Any]:
        """Gauges for /metrics and the SGLang load endpoints."""
        pool = self.pool
        used_blocks = pool.num_usable - pool.num_free
        return {
            "num_running": len(self._running),
            "num_waiting": len(self._waiting),
            "kv_usage": pool.usage(),
            "used_tokens": used_blocks * self.config.block_size,
            "evictable_tokens": pool.num_evictable_cached() * self.config.block_size,
            "capacity_tokens": self.capacity_tokens,
        }

    # -- internals -------------------------------------------------------------------------
    def _admit(self, seq: Sequence, budget: int) -> int:
        """Reserve blocks for a waiting request; the tokens it prefills this step, 0 if none fit."""
        pool = self.pool
        bs = self.config.block_size
        num_tokens = seq.num_tokens
        hashes = self._hashes_upto(seq, num_tokens // bs)
        # The last token is always computed: it produces the next token's logits.
        hit = pool.longest_hit(hashes, (num_tokens - 1) // bs)
        hit_tokens = len(hit) * bs
        num_new = min(num_tokens - hit_tokens, budget)
        evictable = pool.num_evictable(hit)
        full_need = -(-num_tokens // bs) - len(hit) + evictable
        if full_need > pool.num_free:
            return 0
        pool.touch(hit)
        seq.blocks = hit
        seq.num_cached_blocks = len(hit)
        new = -(-(hit_tokens + num_new) // bs) - len(hit)
        if new > 0:
            seq.blocks.extend(pool.allocate(new))
        seq.num_computed = hit_tokens
        self._cache_full_blocks(seq, min(hit_tokens + num_new, num_tokens))
        st = self.stats
        if seq.num_preemptions:
            st.preempted_prefix_cache_queries += num_tokens
            st.preempted_prefix_cache_hits += hit_tokens
        else:
            st.prefix_cache_queries += num_tokens
            st.prefix_cache_hits += hit_tokens
        if seq.num_cached_tokens < 0:
            seq.num_cached_tokens = hit_tokens
        return num_new

    def _cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        bs = self.config.block_size
        nfull = num_tokens // bs
        if seq.num_cached_blocks >= nfull:
            return
        hashes = self._hashes_upto(seq, nfull)
        pool = self.pool
        blocks = seq.blocks
        for i in range(seq.num_cached_blocks, nfull):
            pool.cache(blocks[i], hashes[i])
        seq.num_cached_blocks = nfull

    def _hashes_upto(self, seq: Sequence, n: int) -> list[BlockHash]:
        """The sequence's chain of block hashes, extended to its first `n` blocks."""
        hashes = seq.block_hashes
        if len(hashes) >= n:
            return hashes
        bs = self.config.block_size
        p = seq.prompt_len
        prompt = seq.prompt
        fb = self._filler_blocks
        m = len(fb)
        parent = hashes[-1] if hashes else ROOT_HASH
        for i in range(len(hashes), n):
            start = i * bs
            end = start + bs
            if end <= p:
                block = tuple(prompt[start:end])
            elif start >= p:
                block = fb[(start - p) % m]
            else:
                block = tuple(prompt[start:p]) + fb[0][: end - p]
            parent = hash((parent, block))
            hashes.append(parent)
        return hashes

    def output_ids(self, seq: Sequence, start: int = 0) -> list[int]:
        """Token ids the request has generated, from output position `start`."""
        filler = self._filler
        m = len(filler)
        return [filler[j % m] for j in range(start, seq.num_output)]

    def _enter_decode(self, seq: Sequence, s: int) -> None:
        seq.decoding = True
        seq._k0 = seq.num_computed - s
        seq._o0 = seq.num_output - s
        self._n_decoding += 1
        self._sum_k0 += seq._k0
        seq._finish_at = seq.target - seq._o0
        self._finish_events.setdefault(seq._finish_at, []).append(seq)
        self._schedule_alloc(seq)
        if seq.listener is not None and seq.stream:
            self._streams[seq.run_no] = seq

    def _schedule_alloc(self, seq: Sequence) -> None:
        # Needs a block at the start of step a when computed_before(a) = k0 + a - 1 fills
        # every block it holds.
        a = len(seq.blocks) * self.config.block_size - seq._k0 + 1
        if a <= seq._finish_at:
            seq._alloc_at = a
            self._alloc_events.setdefault(a, []).append(seq)

    def _materialize(self, seq: Sequence, after_step: int) -> None:
        if seq.decoding:
            seq.num_computed = seq._k0 + after_step
            seq.num_output = seq._o0 + after_step

    def _leave_running(self, seq: Sequence, after_step: int) -> None:
        if seq.decoding:
            self._materialize(seq, after_step)
            seq.decoding = False
            self._n_decoding -= 1
            self._sum_k0 -= seq._k0
            self._streams.pop(seq.run_no, None)
        seq._alloc_at = seq._finish_at = -1
        del self._running[seq.run_no]
        self._prefilling.pop(seq.run_no, None)

    def _preempt(self, seq: Sequence, after_step: int) -> None:
        self._leave_running(seq, after_step)
        self._cache_full_blocks(seq, seq.num_computed)
        self.pool.free(reversed(seq.blocks))
        seq.blocks = []
        seq.num_cached_blocks = 0
        seq.num_computed = 0
        seq.num_preemptions += 1
        seq.status = Status.WAITING
        self.stats.num_preemptions += 1
        self._waiting.appendleft(seq)

    def _finish(self, seq: Sequence, s: int, finished: list[Sequence]) -> None:
        self._leave_running(seq, s)
        # The last sampled token never had its KV computed; blocks hold num_computed tokens.
        self._cache_full_blocks(seq, seq.num_computed)
        self.pool.free(reversed(seq.blocks))
        seq.blocks = []
        seq.status = Status.FINISHED
        seq.finish_step = s
        seq.finish_reason = seq.stop_reason
        done = self.stats.requests_finished
        done[seq.stop_reason] = done.get(seq.stop_reason, 0) + 1
        self._by_id.pop(seq.request_id, None)
        finished.append(seq)


def _run_order(seq: Sequence) -> int:
    return seq.run_no
