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
3. the step's duration comes from the cost model (prefill tokens with the keys each attends
   to, decoding sequences and their context); finished requests free their blocks.

Two features a stock vLLM lacks, for the baselines users run:
- a host KV tier (`EngineConfig.host_kv_tokens`, optional disk below it): full blocks evicted
  from the GPU are kept in host memory (LRU, sim/kv_cache.KvTier); a waiting request whose
  prefix continues into them loads them at `host_load_tokens_per_s` instead of recomputing
  them (vLLM's offloading connector, LMCache, SGLang HiCache). The load time is added to the
  step that admits the request; loaded tokens count as cached tokens in its usage.
- TTL pinning (Continuum): a request with `SamplingParams.kv_ttl_s` keeps its full blocks
  pinned (not evictable) after it finishes, until the TTL runs out on the engine's clock
  (`advance(now)` sets it) or the program's next request arrives (same `program_id`, or a
  request whose cached prefix covers the whole pinned context).

Decoding requests are advanced lazily: per step only requests that cross a block boundary
or finish are touched, so a step with hundreds of running requests costs microseconds. The
rest of a long simulation's time goes to blocks (16 tokens each), so the per-block work is
kept small: a waiting request refused for lack of blocks is not re-examined until blocks
come back to the free queue or a block of its own chain is cached (nothing else can make it
fit), and a program's next request starts from the hash chain of its previous one and
checks the blocks that one held before looking hashes up. The free queue is kept as runs of
blocks freed together (sim/kv_cache.BlockPool), so a hit costs a count, not a deletion.
"""

from __future__ import annotations

import enum
import heapq
import zlib
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from thunder_mw.sim.cost_model import StepCost, get_profile, prefill_positions
from thunder_mw.sim.kv_cache import ROOT_HASH, BlockHash, BlockPool, KvTier
from thunder_mw.sim.native_blocks import chain_hashers, repeat_adder
from thunder_mw.sim.program_chains import ProgramChains

__all__ = [
    "PROGRAMS_REMEMBERED",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "Listener",
    "SamplingParams",
    "Sequence",
    "Status",
    "StepResult",
    "TokenIds",
]

# A prompt's token ids: a list (the servers' tokenizer), or an int array (the DES's
# workloads, 4 bytes an id). Read by value only: slices, lengths, equality with the same kind.
TokenIds: TypeAlias = "list[int] | array[int]"

# The compiled chain hashing where it hashes as this Python does (sim/native_blocks.py), picked
# once as the block pool is.
_CHAIN = chain_hashers()
_REPEAT_ADD = repeat_adder()

# Programs whose latest request an engine remembers (Engine._reuse_hashes), oldest dropped.
PROGRAMS_REMEMBERED = 4096


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
    # Host KV tier, in tokens (0: none). Load speed in tokens/s; None: the profile's PCIe
    # link over its KV bytes per token (StepCost.host_load_tokens_per_s).
    host_kv_tokens: int = 0
    host_load_tokens_per_s: float | None = None
    # Disk tier below the host one (0: none); it needs its own load speed.
    disk_kv_tokens: int = 0
    disk_load_tokens_per_s: float | None = None
    # KV bytes per token, for the byte counters of the offload metrics (None: the profile's).
    kv_bytes_per_token: int | None = None
    # Continuum's program-level FCFS (arXiv 2511.02230): the waiting queue is ordered by when
    # each request's program first reached this engine, not by the request's own arrival, so
    # a returning old program goes ahead of newer ones (False: vLLM's request FCFS).
    program_fcfs: bool = False


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    # Continuum's TTL: keep this request's KV pinned for this many seconds after it finishes
    # (None or 0: freed as usual). The vLLM router's `kv_retention_ttl_seconds`.
    kv_ttl_s: float | None = None


class Sequence:
    """One request inside the engine."""

    __slots__ = (
        "_alloc_at",
        "_chain",
        "_finish_at",
        "_k0",
        "_likely",
        "_o0",
        "_refused_at",
        "_refused_epoch",
        "_scheduled_at",
        "block_hashes",
        "blocks",
        "decoding",
        "finish_reason",
        "finish_step",
        "first_token_at",
        "kv_ttl_s",
        "listener",
        "num_cached_blocks",
        "num_cached_tokens",
        "num_computed",
        "num_loaded_tokens",
        "num_output",
        "num_preemptions",
        "program_id",
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
        prompt: TokenIds,
        target: int,
        stop_reason: str,
        listener: Any = None,
        stream: bool = False,
        program_id: str | None = None,
        kv_ttl_s: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.program_id = program_id
        self.kv_ttl_s = kv_ttl_s
        self.prompt = prompt
        self.prompt_len = len(prompt)
        self.target = target  # output tokens it will produce
        self.stop_reason = stop_reason  # "length" (max_tokens) or "stop" (EOS)
        self.listener = listener
        self.stream = stream
        self.status = Status.WAITING
        # Block ids as int32s in one buffer (the compiled pool reads and writes them in place;
        # a list's ints were objects to convert, count and free, a memory miss apiece).
        self.blocks: array[int] = array("i")
        # int64s in one buffer, not a list of ints: the compiled pool reads them in place
        # (each int of a list is its own object, a memory miss apiece in a long context).
        self.block_hashes: array[BlockHash] = array("q")
        self.num_cached_blocks = 0
        self.num_computed = 0
        self.num_output = 0
        self.num_cached_tokens = -1  # prefix hit at first admission, reported in usage
        self.num_loaded_tokens = 0  # of which loaded from the host/disk tier
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
        # A refused admission (Engine._admit): the pool's epoch and new-hash count then, and
        # the hashes a cache hit could use (built on the second refusal).
        self._refused_epoch = -1
        self._refused_at = 0
        self._chain: set[BlockHash] | None = None
        # Blocks that probably hold its hash chain's head (BlockPool.longest_hit): those
        # its program's previous request held, or its own before a preemption.
        self._likely: array[int] | None = None
        # Engine time (simulated seconds) of its first scheduling and its first token: vLLM's
        # request prefill and decode time histograms are measured between these and the end.
        self._scheduled_at = -1.0
        self.first_token_at = -1.0

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
    prompt_tokens_loaded: int = 0  # of the cached ones, loaded from the host/disk tier
    generation_tokens: int = 0
    num_preemptions: int = 0
    requests_finished: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    busy_seconds: float = 0.0
    # Host/disk tier (vLLM's connector counters): tokens past the GPU hit looked up, and
    # found; cached prompt tokens by the tier that held them, counted at admission.
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    cached_by_source: dict[str, int] = field(default_factory=dict)
    # vLLM's per-request phase times, summed over finished requests (its histograms' _sum):
    # first scheduling to first token, the prompt tokens that needed computing, first to
    # last token.
    request_prefill_seconds: float = 0.0
    request_prefill_kv_computed_tokens: int = 0
    request_decode_seconds: float = 0.0
    requests_timed: int = 0
    # vLLM's inter-token latency histogram's sum and count: each token a step decodes (not
    # a first token) waited that step's time since the sequence's last one.
    inter_token_seconds: float = 0.0
    inter_tokens: int = 0
    kv_load_tokens: int = 0
    kv_load_seconds: float = 0.0
    # TTL pins: made, ended by their program's next request, ended by their TTL.
    pins_created: int = 0
    pins_released: int = 0
    pins_expired: int = 0


@dataclass(slots=True)
class _Pin:
    blocks: list[int]  # in eviction order (tail first), as they are freed
    expires_at: float
    key: str


@dataclass(slots=True)
class StepResult:
    duration: float
    prefill_tokens: int
    decode_seqs: int
    decode_context: int
    finished: list[Sequence]
    progressed: list[Sequence]
    preempted: int
    prefill_positions: int = 0  # Σ keys the prefill tokens attend to (the cost's e term)
    admitted: int = 0  # requests taken in from the waiting queue (the cost's f term)


class Engine:
    """The simulated engine. Call `add_request`, then `step()` until `has_work` is False."""

    def __init__(
        self,
        config: EngineConfig,
        filler_ids: list[int],
        cost: StepCost | None = None,
        chains: ProgramChains[Sequence] | None = None,
    ) -> None:
        """`chains`: shared with the other engines of a fleet, where a program's next request
        finds its previous one's hash chain wherever that ran (None: this engine's only)."""
        self.config = config
        self.cost = cost or get_profile(config.profile)
        self.host_tier = self._build_tiers(config, self.cost)
        self.kv_bytes_per_token = config.kv_bytes_per_token or self.cost.kv_bytes_per_token
        self.pool = BlockPool(config.num_blocks, config.block_size, self.host_tier)
        self.stats = EngineStats()
        self._pins: dict[str, _Pin] = {}
        self._pin_expiry: list[tuple[float, int, str]] = []  # heap; stale entries skipped
        self._pin_of_block: dict[int, str] = {}  # a pin's last block -> its key
        self._pin_serial = 0
        self._load_seconds = 0.0  # host/disk loads of the step being built
        self.now = 0.0  # simulated seconds spent in steps
        self.step_no = 0
        self._filler = filler_ids or [0]
        m = len(self._filler)
        bs = config.block_size
        reps = self._filler * (bs // m + 2)
        # Output tokens are filler[j % m]; a block wholly inside the output is one of these.
        self._filler_blocks = [tuple(reps[o : o + bs]) for o in range(m)]
        self._filler_block_hashes = array("q", map(hash, self._filler_blocks))
        self._waiting: deque[Sequence] = deque()
        # vLLM's `num_requests_waiting` gauge: the waiting queue as the last step's schedule
        # left it (the scheduler's stats are made after each step, and a request that arrives
        # during one joins the queue only before the next schedule), so a request the next
        # step takes in at once is never seen waiting. `num_waiting` is the queue right now.
        self.waiting_after_schedule = 0
        self._program_order: dict[str | None, int] = {}  # program_fcfs: first-seen order
        self._running: dict[int, Sequence] = {}  # run_no -> seq, in running order
        self._prefilling: dict[int, Sequence] = {}  # running, prompt not fully computed
        self._streams: dict[int, Sequence] = {}  # running decoders whose listener wants tokens
        self._alloc_events: dict[int, list[Sequence]] = {}
        self._finish_events: dict[int, list[Sequence]] = {}
        self._next_run_no = 0
        self._n_decoding = 0
        self._sum_k0 = 0  # Σ _k0 over decoding sequences
        self._by_id: dict[str, Sequence] = {}
        # Each program's latest request here: the blocks it held are its next one's
        # likeliest hit.
        self._last_of_program: dict[str, Sequence] = {}
        if chains is not None and (
            chains.block_size != bs or chains.filler_ids != list(self._filler)
        ):
            raise ValueError("engines sharing hash chains must share block size and filler")
        # Each program's latest request (on any engine sharing `chains`), whose block hashes
        # its next one can start from.
        self._chains = chains

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

    def target_length(self, prompt: TokenIds, params: SamplingParams) -> tuple[int, str]:
        """How many tokens a request will generate and why it stops: max_tokens with
        ignore_eos, else a deterministic 'natural' length (where the model would emit EOS),
        kept within [min_tokens, max_tokens]."""
        limit = params.max_tokens
        if limit is None:
            limit = self.config.max_model_len - len(prompt)
        limit = max(1, limit)
        if params.ignore_eos:
            return limit, "length"
        # Keyed by the ids' values whatever holds them (a list, or the DES's int array).
        key = repr((self.config.seed, len(prompt), list(prompt[-8:]))).encode()
        natural = max(16 + zlib.crc32(key) % 241, params.min_tokens)
        if natural >= limit:
            return limit, "length"
        return max(1, natural), "stop"

    def validate(self, prompt: TokenIds, params: SamplingParams) -> str | None:
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
        prompt: TokenIds,
        params: SamplingParams | None = None,
        listener: Listener | None = None,
        stream: bool = False,
        program_id: str | None = None,
    ) -> Sequence:
        """Queue a request. `program_id` names the agent program it belongs to: its arrival
        ends a TTL pin the program's previous request left (see `SamplingParams.kv_ttl_s`)."""
        params = params or SamplingParams()
        target, reason = self.target_length(prompt, params)
        seq = Sequence(
            request_id, prompt, target, reason, listener, stream, program_id, params.kv_ttl_s
        )
        if program_id is not None and program_id in self._pins:
            self._release_pin(program_id)
            self.stats.pins_released += 1
        if program_id is not None:
            self._reuse_hashes(seq, program_id)
        if self.config.program_fcfs:
            self._enqueue_by_program(seq, program_id)
        else:
            self._waiting.append(seq)
        self._by_id[request_id] = seq
        return seq

    def _enqueue_by_program(self, seq: Sequence, program_id: str | None) -> None:
        """Behind every waiting request of an older (or the same) program, ahead of newer."""
        order = self._program_order
        mine = order.setdefault(program_id, len(order))
        waiting = self._waiting
        at = len(waiting)
        while at > 0 and order.get(waiting[at - 1].program_id, -1) > mine:
            at -= 1
        waiting.insert(at, seq)

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
            self.pool.free_request(seq.blocks, seq.num_cached_blocks)
            seq.blocks = array("i")
        seq.status = Status.ABORTED
        seq.finish_reason = "abort"
        self.stats.requests_finished["abort"] = self.stats.requests_finished.get("abort", 0) + 1
        return True

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def advance(self, now: float) -> None:
        """Move the engine's clock to `now` (the caller's: the harness's simulated time, the
        server's scaled wall time) if it is later, and end the TTL pins that ran out. Steps
        advance the clock by their duration; idle time passes only through this call."""
        if now > self.now:
            self.now = now
        if self._pin_expiry:  # called before every step: no call when nothing is pinned
            self._expire_pins()

    @property
    def pinned_blocks(self) -> int:
        """Blocks held by TTL pins (a block two pins share counts twice)."""
        return sum(len(p.blocks) for p in self._pins.values())

    def pin_of(self, key: str) -> tuple[int, float] | None:
        """(blocks, expiry time) of the pin a program (or a request without one) left."""
        pin = self._pins.get(key)
        return None if pin is None else (len(pin.blocks), pin.expires_at)

    def step(self) -> StepResult | None:
        """Run one engine step; None when there is nothing to do."""
        if not self._running and not self._waiting:
            return None
        if self._pins:
            self._expire_pins()
        self.step_no += 1
        s = self.step_no
        if (
            self._running
            and not self._prefilling
            and not self._streams
            and s not in self._finish_events
            and self._decode_only(s)
        ):
            # Most steps of a long run: decoders only, none finishing, nobody admitted. The
            # phases below would find nothing more to do (no prefill, no token to hand out).
            self.waiting_after_schedule = len(self._waiting)
            return self._forward_pass(s, [], 0, 0)
        scheduled: list[tuple[Sequence, int]] = []
        budget, preempted = self._schedule_running(s, scheduled)
        # Waiting requests join only in a step that preempted nothing.
        admitted = 0 if preempted else self._schedule_waiting(budget, scheduled)
        self.waiting_after_schedule = len(self._waiting)
        result = self._forward_pass(s, scheduled, preempted, admitted)
        self._complete(s, scheduled, result)
        for seq in result.progressed:
            seq.listener.on_progress(seq)
        for seq in result.finished:
            if seq.listener is not None:
                seq.listener.on_finish(seq)
        return result

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
            "pinned_tokens": self.pinned_blocks * self.config.block_size,
            "host_tokens": len(self.host_tier or ()) * self.config.block_size,
        }

    # -- the phases of a step --------------------------------------------------------------
    def _schedule_running(self, s: int, scheduled: list[tuple[Sequence, int]]) -> tuple[int, int]:
        """Phase 1, running requests: a block for each decoder crossing a block boundary, the
        next chunk of each prefill; decoders not crossing one need nothing: they are counted,
        not visited. Appends the prefill chunks to `scheduled`; returns the token budget left
        and how many requests were preempted."""
        bs = self.config.block_size
        budget = self.config.max_num_batched_tokens - self._n_decoding
        pool = self.pool
        preempted = 0
        for seq in self._due_in_step(s):
            if seq.decoding:
                if seq._alloc_at != s:
                    continue  # stale event, or preempted earlier in this step
                if not pool.num_free:
                    preempted += self._preempt_for(seq, 1, s)
                    if not seq.decoding:
                        continue
                self._grow_decoder(seq, s)
                continue
            if seq.status is not Status.RUNNING or budget <= 0:
                continue
            num_new = min(seq.num_tokens - seq.num_computed, budget)
            need = -(-(seq.num_computed + num_new) // bs) - len(seq.blocks)
            if need > pool.num_free:
                preempted += self._preempt_for(seq, need, s)
                if seq.status is not Status.RUNNING:
                    continue
            if need > 0:
                seq.blocks.extend(pool.allocate(need))
            self._cache_full_blocks(seq, seq.num_computed + num_new)
            scheduled.append((seq, num_new))
            budget -= num_new
        if preempted:
            # Preempted decoders were counted before they left; give their tokens back.
            budget = self.config.max_num_batched_tokens - self._n_decoding
            budget -= sum(n for _, n in scheduled)
        return budget, preempted

    def _decode_only(self, s: int) -> bool:
        """Phases 1 and 2 of step `s` where every running request decodes (none prefills):
        when no decoder due a block could preempt and no waiting request could be admitted,
        give the due decoders their blocks and return True; else change nothing, return
        False (the full phases run)."""
        pool = self.pool
        due = self._alloc_events.get(s)
        if due is not None and len(due) > pool.num_free:
            return False  # blocks may run out: who preempts whom needs the running order
        waiting = self._waiting
        if (
            waiting
            and self._n_decoding < self.config.max_num_batched_tokens
            and len(self._running) < self.config.max_num_seqs
        ):
            # Phase 2 would look at the head: only a refusal that still holds skips it.
            # Giving decoders blocks neither frees blocks nor caches hashes, so the check
            # holds after them as it does here.
            head = waiting[0]
            if head._refused_epoch != pool.free_epoch or head._refused_at != pool.num_new_hashes:
                return False
        if due is not None:
            del self._alloc_events[s]
            # In event order, as `_due_in_step` leaves them with blocks enough; entries of
            # requests that left running since are stale (a running request decodes here).
            for seq in due:
                if seq.decoding and seq._alloc_at == s:
                    self._grow_decoder(seq, s)
        return True

    def _due_in_step(self, s: int) -> list[Sequence]:
        """The running requests phase 1 visits: decoders whose block fills at step `s`, and
        every request in chunked prefill, in running order where blocks may run out."""
        special = self._alloc_events.pop(s, None) or []
        if self._prefilling:
            # An event of a decoder preempted since is stale; once readmitted it prefills
            # again and comes from `_prefilling`: without this filter it would be scheduled
            # twice in one step (and its prefill entry deleted twice).
            special = [q for q in special if q.decoding]
            special.extend(self._prefilling.values())
        # Order matters only when blocks may run out (who preempts whom).
        if len(special) > 1 and (self._prefilling or self.pool.num_free < len(special)):
            special.sort(key=_run_order)
        return special

    def _preempt_for(self, seq: Sequence, need: int, s: int) -> int:
        """Preempt the newest running requests until `need` blocks are free or `seq` itself
        went (then it waits: the caller checks its status); returns how many went."""
        pool = self.pool
        running = self._running
        preempted = 0
        while need > pool.num_free:
            victim = running[next(reversed(running))]
            self._preempt(victim, s - 1)
            preempted += 1
            if victim is seq:
                break
        return preempted

    def _grow_decoder(self, seq: Sequence, s: int) -> None:
        """A decoder's next block, and the step its next one is due."""
        # Its blocks are all full now. Their hashes are registered when it stops running:
        # no other request can hold its unseen output in a prompt before.
        seq.blocks.append(self.pool.allocate_one())
        nxt = s + self.config.block_size
        if nxt <= seq._finish_at:
            seq._alloc_at = nxt
            alloc_events = self._alloc_events
            lst = alloc_events.get(nxt)
            if lst is None:
                alloc_events[nxt] = [seq]
            else:
                lst.append(seq)
        else:
            seq._alloc_at = -1

    def _schedule_waiting(self, budget: int, scheduled: list[tuple[Sequence, int]]) -> int:
        """Phase 2, waiting requests in order while the budget lasts and fewer than
        max_num_seqs run; appends their first chunks to `scheduled`, returns how many."""
        admitted = 0
        max_seqs = self.config.max_num_seqs
        waiting = self._waiting
        pool = self.pool
        while budget > 0 and waiting and len(self._running) < max_seqs:
            seq = waiting[0]
            if seq._refused_epoch == pool.free_epoch and seq._refused_at == pool.num_new_hashes:
                break  # refused, and nothing came back or got cached since (see `_admit`)
            num_new = self._admit(seq, budget)
            if num_new == 0:
                break
            waiting.popleft()
            seq.status = Status.RUNNING
            seq.run_no = self._next_run_no
            self._next_run_no += 1
            self._running[seq.run_no] = seq
            self._prefilling[seq.run_no] = seq
            scheduled.append((seq, num_new))
            budget -= num_new
            admitted += 1
        return admitted

    def _forward_pass(
        self, s: int, scheduled: list[tuple[Sequence, int]], preempted: int, admitted: int
    ) -> StepResult:
        """Phase 3, the forward pass's time, after loading what the admitted requests found
        in the tiers; the engine's clock moves past it."""
        n_dec = self._n_decoding
        ctx = self._sum_k0 + n_dec * s  # Σ (computed before this step + 1)
        prefill_tokens = positions = 0
        if scheduled:  # most steps only decode: no generators to build then
            prefill_tokens = sum(n for _, n in scheduled)
            # Attention: each chunk's tokens attend to what is before them (cached, loaded
            # or computed in earlier chunks) and to each other, causally.
            positions = sum(prefill_positions(seq.num_computed, n) for seq, n in scheduled)
        duration = self.cost.step_seconds(prefill_tokens, n_dec, ctx, positions, admitted)
        duration += self._load_seconds
        self._load_seconds = 0.0
        if not self._running and self._pins and not preempted:
            # Nothing fits while pins hold the blocks: the engine waits for the next expiry.
            duration = max(duration, min(p.expires_at for p in self._pins.values()) - self.now)
        self.now += duration
        st = self.stats
        st.steps += 1
        st.busy_seconds += duration
        st.generation_tokens += n_dec
        st.inter_token_seconds += duration * n_dec
        st.inter_tokens += n_dec
        return StepResult(
            duration, prefill_tokens, n_dec, ctx, [], [], preempted, positions, admitted
        )

    def _complete(self, s: int, scheduled: list[tuple[Sequence, int]], result: StepResult) -> None:
        """Phase 4, the step's tokens: prefills that completed sample their first token (and
        decode on, or finish), decoders due to finish finish; streams catch up. Fills the
        result's `finished` and `progressed`."""
        st = self.stats
        finished = result.finished
        progressed = result.progressed
        for seq, num_new in scheduled:
            seq.num_computed += num_new
            if seq.num_computed < seq.num_tokens:
                continue  # more chunks to go
            del self._prefilling[seq.run_no]
            if seq.num_output == 0:
                seq.first_token_at = self.now
            if seq.num_preemptions == 0 and seq.num_output == 0:
                st.prompt_tokens += seq.prompt_len
                st.prompt_tokens_cached += max(seq.num_cached_tokens, 0)
                st.prompt_tokens_loaded += seq.num_loaded_tokens
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

    # -- internals -------------------------------------------------------------------------
    def _admit(self, seq: Sequence, budget: int) -> int:
        """Reserve blocks for a waiting request; the tokens it prefills this step, 0 if none fit."""
        pool = self.pool
        bs = self.config.block_size
        num_tokens = seq.num_tokens
        hashes = self._hashes_upto(seq, num_tokens // bs)
        # The last token is always computed: it produces the next token's logits.
        max_blocks = (num_tokens - 1) // bs
        if seq._refused_epoch == pool.free_epoch:
            # Refused before, and no block came back to the free queue since: only a newly
            # cached block of its own chain could make it fit now (a failed attempt changes
            # nothing, so skipping it changes nothing either).
            fresh = pool.num_new_hashes
            if seq._chain is None:
                seq._chain = set(hashes[:max_blocks])
            if fresh == seq._refused_at or seq._chain.isdisjoint(
                pool.new_hashes_since(seq._refused_at)
            ):
                seq._refused_at = fresh
                return 0
        hit = pool.longest_hit(hashes, max_blocks, seq._likely)
        hit_tokens = len(hit) * bs
        full_need = -(-num_tokens // bs)
        # Hit blocks that are free still count against the free ones; when the whole
        # sequence fits in the free blocks it fits whatever they are (no need to count).
        if full_need > pool.num_free:
            full_need += pool.num_evictable(hit) - len(hit)
        if full_need > pool.num_free:
            seq._refused_epoch = pool.free_epoch
            seq._refused_at = pool.num_new_hashes
            return 0
        seq._refused_epoch = -1
        seq._chain = None
        seq._likely = None
        # Read before allocating: the blocks allocation evicts may push these out.
        tiers = self._load_from_tiers(hashes, len(hit), max_blocks) if self.host_tier else []
        loaded_tokens = len(tiers) * bs
        num_new = min(num_tokens - hit_tokens - loaded_tokens, budget)
        pool.touch(hit)
        if self._pin_of_block and hit:
            # The program's next request: its prefix covers the whole pinned context.
            key = self._pin_of_block.get(hit[-1])
            if key is not None:
                self._release_pin(key)
                self.stats.pins_released += 1
        seq.blocks = hit
        seq.num_cached_blocks = len(hit)
        new = -(-(hit_tokens + loaded_tokens + num_new) // bs) - len(hit)
        if new > 0:
            seq.blocks.extend(pool.allocate(new))
        seq.num_computed = hit_tokens + loaded_tokens
        self._cache_full_blocks(seq, min(hit_tokens + loaded_tokens + num_new, num_tokens))
        self._count_prefix_hits(seq, num_tokens, hit_tokens, tiers)
        if seq._scheduled_at < 0:
            seq._scheduled_at = self.now  # this step's start
        if seq.num_cached_tokens < 0:
            seq.num_cached_tokens = hit_tokens + loaded_tokens
            seq.num_loaded_tokens = loaded_tokens
        return num_new

    def _load_from_tiers(
        self, hashes: array[BlockHash], start: int, max_blocks: int
    ) -> list[KvTier]:
        """Load the blocks from `start` on that the tiers hold, up to the first block none
        holds, adding the time it takes to the step being built; the tier of each."""
        bs = self.config.block_size
        host = self.host_tier
        assert host is not None
        stretches: list[tuple[KvTier, int]] = []  # (tier, blocks loaded from it), in order
        if host.lower is None:
            # One tier: its run of held blocks found and loaded in one pass (in C), rather
            # than looked up, then looked up again to be moved.
            end = min(max_blocks, len(hashes))
            n = host.load_prefix(hashes[start:end]) if start < end else 0
            tiers = [host] * n
            if n:
                stretches.append((host, n))
        else:
            tiers = self._tier_hits(hashes, start, max_blocks)
            # Per stretch of one tier, one call.
            i = 0
            while i < len(tiers):
                tier = tiers[i]
                j = i + 1
                while j < len(tiers) and tiers[j] is tier:
                    j += 1
                tier.load_many(hashes[start + i : start + j])
                stretches.append((tier, j - i))
                i = j
        if not tiers:
            return tiers
        seconds = 0.0
        for tier, k in stretches:
            # `seconds += per_block`, block by block: the same additions in the same order.
            seconds = _REPEAT_ADD(seconds, bs / tier.load_tokens_per_s, k)
        self._load_seconds += seconds
        st = self.stats
        st.kv_load_tokens += len(tiers) * bs
        st.kv_load_seconds += seconds
        return tiers

    def _count_prefix_hits(
        self, seq: Sequence, num_tokens: int, hit_tokens: int, tiers: list[KvTier]
    ) -> None:
        """vLLM's prefix-cache counters for one admission (a preempted request's apart)."""
        st = self.stats
        if seq.num_preemptions:
            st.preempted_prefix_cache_queries += num_tokens
            st.preempted_prefix_cache_hits += hit_tokens
            return
        bs = self.config.block_size
        st.prefix_cache_queries += num_tokens
        st.prefix_cache_hits += hit_tokens
        if self.host_tier is not None:
            st.external_prefix_cache_queries += num_tokens - hit_tokens
            st.external_prefix_cache_hits += len(tiers) * bs
        by_source = st.cached_by_source
        if hit_tokens:
            by_source["device"] = by_source.get("device", 0) + hit_tokens
        if tiers:
            per_tier: dict[str, int] = {}  # in order of first appearance, as keys are added
            # Counted per tier, not per block (a long context loads thousands of blocks);
            # with one tier, every block loaded is the host's.
            host = self.host_tier
            if host is not None and host.lower is None:
                per_tier[host.name] = len(tiers) * bs
            else:
                for tier in dict.fromkeys(tiers):
                    per_tier[tier.name] = per_tier.get(tier.name, 0) + tiers.count(tier) * bs
            for name, tokens in per_tier.items():
                by_source[name] = by_source.get(name, 0) + tokens

    def _tier_hits(self, hashes: array[BlockHash], start: int, max_blocks: int) -> list[KvTier]:
        """The tier holding each block from `start` on, up to the first block none holds."""
        end = min(max_blocks, len(hashes))
        out: list[KvTier] = []
        for i in range(start, end):
            tier = self.host_tier
            while tier is not None and hashes[i] not in tier:
                tier = tier.lower
            if tier is None:
                break
            out.append(tier)
        return out

    def _cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        bs = self.config.block_size
        nfull = num_tokens // bs
        if seq.num_cached_blocks >= nfull:
            return
        hashes = self._hashes_upto(seq, nfull)
        self.pool.cache_range(seq.blocks, hashes, seq.num_cached_blocks, nfull)
        seq.num_cached_blocks = nfull

    def _hashes_upto(self, seq: Sequence, n: int) -> array[BlockHash]:
        """The sequence's chain of block hashes, extended to its first `n` blocks."""
        hashes = seq.block_hashes
        if len(hashes) >= n:
            return hashes
        bs = self.config.block_size
        p = seq.prompt_len
        i = len(hashes)
        parent = hashes[-1] if hashes else ROOT_HASH
        append = hashes.append
        # Blocks wholly inside the prompt: zip over one iterator cuts the bs-tuples in C.
        in_prompt = min(n, p // bs)
        chain = _CHAIN
        if i < in_prompt:
            prompt = seq.prompt
            if chain is not None and type(prompt) is array and prompt.typecode == "I":
                # The DES's prompts: the same hashes, computed in C from the ids in place.
                hashes.extend(chain.over_ids(parent, prompt, i * bs, in_prompt * bs, bs))
                parent = hashes[-1]
            else:
                it = iter(prompt[i * bs : in_prompt * bs])
                for block in zip(*([it] * bs), strict=False):
                    parent = hash((parent, block))
                    append(parent)
            i = in_prompt
        fb = self._filler_blocks
        m = len(fb)
        if i < n and i * bs < p:  # the block the prompt ends in, the answer's first tokens after
            block = tuple(seq.prompt[i * bs : p]) + fb[0][: (i + 1) * bs - p]
            parent = hash((parent, block))
            append(parent)
            i += 1
        # Blocks wholly inside the output: filler blocks, at offset (start - p) % m.
        if i < n and chain is not None:
            hashes.extend(
                chain.over_blocks(parent, self._filler_block_hashes, i * bs - p, bs, n - i)
            )
        else:
            for k in range(i, n):
                parent = hash((parent, fb[(k * bs - p) % m]))
                append(parent)
        return hashes

    def _reuse_hashes(self, seq: Sequence, program_id: str) -> None:
        """Start `seq`'s hash chain with its program's previous request's, as far as the
        tokens agree (an agent's next call repeats its last prompt and answer): hashing a
        100 k-token context again per call was a fifth of a long simulation's time.

        Prompts are read lazily, so a caller must not change one in place while the engine
        holds it (appending is fine: only positions below `prompt_len` are read)."""
        last = self._last_of_program
        here = last.pop(program_id, None)
        last[program_id] = seq
        if len(last) > PROGRAMS_REMEMBERED:
            del last[next(iter(last))]
        prev = here if self._chains is None else self._chains.swap(program_id, seq)
        if prev is None or not prev.block_hashes:
            return
        n = prev.prompt_len
        prompt = seq.prompt
        if seq.prompt_len < n or (prompt is not prev.prompt and prompt[:n] != prev.prompt[:n]):
            return
        # Past its prompt, the previous request's blocks hold its output (filler tokens).
        out = min(prev.num_output, seq.prompt_len - n)
        agree = n + out if list(prompt[n : n + out]) == self.output_ids(prev)[:out] else n
        keep = agree // self.config.block_size
        if prev.status is Status.FINISHED or prev.status is Status.ABORTED:
            # Done with it: hand the chain over rather than copy it (a copy touches every
            # hash object, each a cache miss in a long context).
            seq.block_hashes = prev.block_hashes
            prev.block_hashes = array("q")
            del seq.block_hashes[keep:]
        else:
            seq.block_hashes = prev.block_hashes[:keep]
        # Only a hint (BlockPool.longest_hit checks each block): the blocks of this engine.
        if here is not None:
            seq._likely = here._likely

    def output_ids(self, seq: Sequence, start: int = 0) -> list[int]:
        """Token ids the request has generated, from output position `start`."""
        n = seq.num_output - start
        if n <= 0:
            return []
        # filler[j % m] for j in [start, num_output), cut from repeats of it in C.
        filler = self._filler
        m = len(filler)
        first = start % m
        return (filler * ((first + n) // m + 1))[first : first + n]

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
        self.pool.free_request(seq.blocks, seq.num_cached_blocks)
        seq._likely = seq.blocks
        seq.blocks = array("i")
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
        if seq.kv_ttl_s and seq.num_cached_blocks:
            # Its full blocks stay held, now by the pin: freeing them and taking them back
            # would leave the pool as it was, so only the rest is freed.
            self.pool.free_request(seq.blocks[seq.num_cached_blocks :], 0)
            self._pin(seq)
        else:
            self.pool.free_request(seq.blocks, seq.num_cached_blocks)
        seq._likely = seq.blocks  # for the program's next request
        seq.blocks = array("i")
        seq.status = Status.FINISHED
        seq.finish_step = s
        seq.finish_reason = seq.stop_reason
        st = self.stats
        done = st.requests_finished
        done[seq.stop_reason] = done.get(seq.stop_reason, 0) + 1
        if seq._scheduled_at >= 0 and seq.first_token_at >= 0:
            st.request_prefill_seconds += seq.first_token_at - seq._scheduled_at
            st.request_prefill_kv_computed_tokens += seq.prompt_len - max(seq.num_cached_tokens, 0)
            st.request_decode_seconds += self.now - seq.first_token_at
            st.requests_timed += 1
        self._by_id.pop(seq.request_id, None)
        finished.append(seq)

    # -- TTL pins and tiers ----------------------------------------------------------------
    def _pin(self, seq: Sequence) -> None:
        """Hold a finished request's full blocks until its TTL ends: the references the
        request held on them pass to the pin (`_finish` did not drop them)."""
        key = seq.program_id or seq.request_id
        if key in self._pins:
            self._release_pin(key)
        blocks = seq.blocks[: seq.num_cached_blocks]
        assert seq.kv_ttl_s is not None
        pin = _Pin(list(reversed(blocks)), self.now + seq.kv_ttl_s, key)
        self._pins[key] = pin
        self._pin_of_block[blocks[-1]] = key
        self._pin_serial += 1
        heapq.heappush(self._pin_expiry, (pin.expires_at, self._pin_serial, key))
        self.stats.pins_created += 1

    def _release_pin(self, key: str) -> None:
        pin = self._pins.pop(key)
        if self._pin_of_block.get(pin.blocks[0]) == key:
            del self._pin_of_block[pin.blocks[0]]
        # Back to the free queue, tail first like a finished request's blocks.
        self.pool.free_cached(pin.blocks)

    def _expire_pins(self) -> None:
        heap = self._pin_expiry
        while heap and heap[0][0] <= self.now:
            expires_at, _, key = heapq.heappop(heap)
            pin = self._pins.get(key)
            if pin is not None and pin.expires_at == expires_at:
                self._release_pin(key)
                self.stats.pins_expired += 1

    @staticmethod
    def _build_tiers(config: EngineConfig, cost: StepCost) -> KvTier | None:
        bs = config.block_size
        if config.host_kv_tokens <= 0:
            if config.disk_kv_tokens > 0:
                raise ValueError("a disk KV tier needs a host tier above it (host_kv_tokens)")
            return None
        disk = None
        if config.disk_kv_tokens > 0:
            if not config.disk_load_tokens_per_s:
                raise ValueError("the disk KV tier needs disk_load_tokens_per_s")
            disk = KvTier("disk", config.disk_kv_tokens // bs, config.disk_load_tokens_per_s)
        speed = config.host_load_tokens_per_s or cost.host_load_tokens_per_s()
        if not speed:
            raise ValueError(
                f"the host KV tier needs host_load_tokens_per_s: profile {config.profile!r} "
                "states no PCIe link and KV bytes per token"
            )
        return KvTier("host", config.host_kv_tokens // bs, speed, disk)


def _run_order(seq: Sequence) -> int:
    return seq.run_no
