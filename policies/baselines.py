"""The routers and engines users run in front of agents today, as stages to compare against.

Each is a `Stage` like thunder-mw's own, pure and clock-injected, so the discrete-event
harness compares them on the same engines and workloads, and each could run live:

- `kv_aware`: per-request engine choice by prefix overlap against load (Dynamo's KvRouter
  cost, SGLang's cache-aware policy) from an approximate index of what was routed where;
  no admission control, no pausing.
- `session_affinity`: consistent (rendezvous) hashing of the program id onto the engines.
- `direct`: no gateway: every request to one engine (a client configured with its URL).
- `continuum_ttl`: asks a TTL-pinning engine (Continuum) to keep each call's KV for a TTL
  predicted from the program's tool time.
- `progress_ttl` and `batch_gain`: the vLLM router's program scheduler as its package and
  binary document it (Progress-TTL with return-time prediction, segment yielding,
  batch-gain admission); the preset composes them with admission and the global queue.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import zlib
from collections.abc import Iterator

from thunder_mw.policies.decisions import Pause, StageDecision
from thunder_mw.policies.prefix_index import PrefixIndex
from thunder_mw.policies.program_table import Phase, ProgramState, Usage
from thunder_mw.policies.stage_contract import Decisions, Stage, StageView
from thunder_mw.policies.views import BackendView, ProgramView

# Re-exported: stage authors and older code import these names from here.
from thunder_mw.schemas.stage_params import BatchGainParams as BatchGainParams
from thunder_mw.schemas.stage_params import ContinuumTtlParams as ContinuumTtlParams
from thunder_mw.schemas.stage_params import KvAwareParams as KvAwareParams
from thunder_mw.schemas.stage_params import ProgramBindingParams as ProgramBindingParams
from thunder_mw.schemas.stage_params import ProgramGateParams as ProgramGateParams
from thunder_mw.schemas.stage_params import ProgressTtlParams as ProgressTtlParams
from thunder_mw.schemas.stage_params import StageParams as StageParams

__all__ = [
    "BASELINE_STAGES",
    "BatchGain",
    "ContinuumTtl",
    "Direct",
    "KvAware",
    "ProgramBinding",
    "ProgramGate",
    "ProgressTtl",
    "SessionAffinity",
]


# ---------------------------------------------------------------------------- kv_aware
class KvAware(Stage):
    """Every request goes to the engine with the lowest `weight x tokens to prefill + active
    tokens`, where the tokens to prefill are the request's prompt less what the index says
    that engine still caches of this program, and active tokens are the footprints of the
    requests in flight there.

    The index is approximate, as SGLang's cache-aware tree is: it records what was routed
    where (a program's context, refreshed by the answer's usage) and evicts per engine in
    LRU order past its capacity. Prefixes are tracked per program: agent prompts extend the
    program's previous prompt, so a program's overlap with an engine is the context it
    last ran there. A system prompt shared across programs is not tracked (a few percent of
    an agent's reusable KV, reference/agent-workloads.md)."""

    name = "kv_aware"
    Params = KvAwareParams
    params: KvAwareParams

    def __init__(self, params: StageParams | None = None) -> None:
        super().__init__(params)
        self._index: PrefixIndex | None = None
        self._active: dict[str, int] = {}
        self._calls: dict[str, collections.deque[tuple[str, int]]] = {}

    def bind(self, view: StageView) -> Decisions:
        self._index = PrefixIndex(
            lambda label: view.backends[label].capacity if label in view.backends else None,
            self.params.index_fraction,
        )
        for label in view.backends:
            self._active[label] = 0
        return ()

    # -- the decision
    def overlap(self, backend: str, program_id: str) -> int:
        """Tokens of the program the index believes `backend` still caches."""
        return self._index.overlap(backend, program_id) if self._index is not None else 0

    def active_tokens(self, backend: str) -> int:
        return self._active.get(backend, 0)

    def choose(self, view: StageView, program: ProgramView) -> str | None:
        prompt = self._prompt_tokens(view, program)
        best: tuple[float, int, str] | None = None
        for backend in view.healthy_backends():
            label = backend.label
            new = prompt - min(prompt, self.overlap(label, program.program_id))
            active = self._active.get(label, 0)
            key = (self.params.overlap_weight * new + active, active, label)
            if best is None or key < best:
                best = key
        return None if best is None else best[2]

    def route(self, view: StageView, program: ProgramView, now: float) -> str | None:
        target = self.choose(view, program)
        if target is not None:
            self._record(view, program, target)
        return target

    def place(self, view: StageView, program: ProgramView, now: float) -> str | None:
        target = self.choose(view, program)
        if target is None:
            return ""
        if program.waiting:
            self._record(view, program, target)
        return target

    # -- bookkeeping
    def _prompt_tokens(self, view: StageView, program: ProgramView) -> int:
        estimate = view.prompt_tokens(program.last_prompt_chars, program.backend)
        return max(program.context_tokens, estimate)

    def _record(self, view: StageView, program: ProgramView, backend: str) -> None:
        tokens = program.request_tokens
        self._active[backend] = self._active.get(backend, 0) + tokens
        self._calls.setdefault(program.program_id, collections.deque()).append((backend, tokens))
        self._remember(view, backend, program.program_id, self._prompt_tokens(view, program))

    def _remember(self, view: StageView, backend: str, program_id: str, tokens: int) -> None:
        if self._index is not None:
            self._index.remember(backend, program_id, tokens)

    def on_finished(
        self, view: StageView, program: ProgramView, usage: Usage | None, ok: bool, now: float
    ) -> Decisions:
        calls = self._calls.get(program.program_id)
        if not calls:
            return ()
        backend, tokens = calls.popleft()
        if not calls:
            del self._calls[program.program_id]
        self._active[backend] = max(0, self._active.get(backend, 0) - tokens)
        if ok and usage is not None:
            context = usage.prompt_tokens + usage.completion_tokens
            self._remember(view, backend, program.program_id, context)
        return ()

    def on_release(
        self, view: StageView, program: ProgramView, reason: str, now: float
    ) -> Decisions:
        for backend, tokens in self._calls.pop(program.program_id, ()):
            self._active[backend] = max(0, self._active.get(backend, 0) - tokens)
        if self._index is not None:
            self._index.forget(program.program_id)
        return ()


# ---------------------------------------------------------------------------- session_affinity
class SessionAffinity(Stage):
    """Consistent hashing of the program id (rendezvous hashing: the healthy engine with the
    highest hash of program id and engine label), for every request: a program always runs
    on one engine, and losing an engine moves only that engine's programs. No admission
    control, no load balancing beyond the hash."""

    name = "session_affinity"

    @staticmethod
    def pick(program_id: str, labels: list[str]) -> str | None:
        if not labels:
            return None
        return max(labels, key=lambda label: (zlib.crc32(f"{program_id}|{label}".encode()), label))

    def route(self, view: StageView, program: ProgramView, now: float) -> str | None:
        return self.pick(program.program_id, [b.label for b in view.healthy_backends()])

    def place(self, view: StageView, program: ProgramView, now: float) -> str | None:
        return self.route(view, program, now) or ""


# ---------------------------------------------------------------------------- direct
class Direct(Stage):
    """No gateway: every request goes to the first healthy engine (a client configured with
    one engine's URL). The `vllm` and `continuum` baselines on one-engine scenarios."""

    name = "direct"

    def route(self, view: StageView, program: ProgramView, now: float) -> str | None:
        healthy = view.healthy_backends()
        return healthy[0].label if healthy else None

    def place(self, view: StageView, program: ProgramView, now: float) -> str | None:
        return self.route(view, program, now) or ""


# ---------------------------------------------------------------------------- continuum_ttl
class ContinuumTtl(Stage):
    """Continuum's TTL (arXiv 2511.02230): when a call ends in a tool call, the engine pins
    the call's KV for a TTL chosen from the predicted tool time, and evicts it when the TTL
    expires. This stage only predicts the TTL — from the program's own tool-time EMA, else
    its session type's (policies/estimates.py) — and passes it with each request; pinning
    is the engine's (a TTL-capable engine such as the simulator's; a stock vLLM ignores it).
    Continuum's closed-form TTL weighs the reload cost against the memory held; here a long
    expected tool (over `max_ttl_s`) gets no pin, a short one `ttl_multiplier` x its mean."""

    name = "continuum_ttl"
    Params = ContinuumTtlParams
    params: ContinuumTtlParams

    def kv_ttl(self, view: StageView, program: ProgramView, now: float) -> float | None:
        expected = view.expected_tool_time(program)
        if expected > self.params.max_ttl_s:
            return 0.0
        return min(self.params.max_ttl_s, self.params.ttl_multiplier * expected)


# ---------------------------------------------------------------------------- progress_ttl
class ProgressTtl(Stage):
    """The vLLM router's Progress-TTL as its binary describes it: when a program's call ends,
    a TTL is armed from a prediction of when it returns (a quantile of its session type's
    observed return times, capped); a program still ACTING when its TTL expires is paused
    (`ttl_expired`), its reservation released to the queue. A program that has been served
    `max_segment_rounds` calls since its admission yields when others wait
    (`max_segment_yield`)."""

    name = "progress_ttl"
    Params = ProgressTtlParams
    params: ProgressTtlParams

    def __init__(self, params: StageParams | None = None) -> None:
        super().__init__(params)
        self._returns: dict[str, collections.deque[float]] = {}
        self._sorted: dict[str, list[float]] = {}
        self._deadlines: list[tuple[float, float, str]] = []  # (deadline, acting_since, id)
        self._rounds: dict[str, tuple[int, int]] = {}  # id -> (pauses seen, rounds served)
        self._deadline_of: dict[str, float] = {}

    def remaining(self, program: ProgramView, now: float) -> float:
        """Seconds until the program's armed TTL expires (0 when none is armed)."""
        return max(0.0, self._deadline_of.get(program.program_id, now) - now)

    def predicted_ttl(self, session_type: str | None) -> float:
        cap = self.params.max_acting_ttl_s
        samples = self._sorted.get(session_type or "")
        if not samples or len(samples) < self.params.min_samples:
            immature = self.params.immature_ttl_s
            return cap if immature is None else min(cap, immature)
        k = min(len(samples) - 1, int(self.params.return_quantile * len(samples)))
        return min(cap, samples[k])

    def _observe(self, session_type: str | None, gap: float) -> None:
        key = session_type or ""
        window = self._returns.setdefault(key, collections.deque())
        ordered = self._sorted.setdefault(key, [])
        if len(window) >= self.params.window:
            old = window.popleft()
            del ordered[bisect.bisect_left(ordered, old)]
        window.append(gap)
        bisect.insort(ordered, gap)

    def on_request(self, view: StageView, program: ProgramView, now: float) -> Decisions:
        if program.steps > 0 and program.in_flight == 0 and program.waiting == 0:
            self._observe(program.session_type, max(0.0, now - program.acting_since))
        return ()

    def on_finished(
        self, view: StageView, program: ProgramView, usage: Usage | None, ok: bool, now: float
    ) -> Decisions:
        if program.in_flight or program.state is not ProgramState.ACTIVE:
            return ()
        pauses, rounds = self._rounds.get(program.program_id, (program.pauses, 0))
        if pauses != program.pauses:  # paused and resumed since: a new segment
            rounds = 0
        rounds += 1
        self._rounds[program.program_id] = (program.pauses, rounds)
        limit = self.params.max_segment_rounds
        if limit is not None and rounds >= limit and view.queue_length() > 0:
            return (Pause(program, "max_segment_yield"),)
        ttl = self.predicted_ttl(program.session_type)
        if ttl <= 0:
            # A TTL of 0 (the router's until its statistics window is full) pauses the
            # program as its call ends: left to the next tick, it would keep its place
            # through any tool shorter than the tick (issue 26: the real router paused
            # after 23 of 24 calls, the stand-in held on through most of them).
            self._deadline_of.pop(program.program_id, None)
            return (Pause(program, "ttl_expired"),)
        deadline = now + ttl
        self._deadline_of[program.program_id] = deadline
        heapq.heappush(self._deadlines, (deadline, program.acting_since, program.program_id))
        return ()

    def on_tick(self, view: StageView, now: float) -> Iterator[StageDecision]:
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, since, program_id = heapq.heappop(heap)
            program = view.program(program_id)
            if (
                program is not None
                and program.state is ProgramState.ACTIVE
                and program.phase is Phase.ACTING
                and program.in_flight == 0
                and program.acting_since == since
            ):
                yield Pause(program, "ttl_expired")

    def on_release(
        self, view: StageView, program: ProgramView, reason: str, now: float
    ) -> Decisions:
        self._rounds.pop(program.program_id, None)
        self._deadline_of.pop(program.program_id, None)
        return ()


# ---------------------------------------------------------------------------- batch_gain
class BatchGain(Stage):
    """Batch-gain admission (the vLLM router's `enable_batch_gain_admission`, read from its
    binary's config keys and decision reasons; its arithmetic is not published): when the
    queue's head fits nowhere, ACTING programs still within their Progress-TTL give their
    room up early if the wait this saves the head (until their TTLs would have freed the
    room) exceeds the re-prefill their eviction will cost them (the prefill cost model:
    intercept + seconds per 1k context tokens)."""

    name = "batch_gain"
    Params = BatchGainParams
    params: BatchGainParams

    def bind(self, view: StageView) -> Decisions:
        self._ttl = next((s for s in view.stages if isinstance(s, ProgressTtl)), None)
        admission = next((s for s in view.stages if s.name == "admission"), None)
        self._high: float = getattr(admission.params, "high_watermark", 1.0) if admission else 1.0
        return ()

    def recompute_s(self, tokens: int) -> float:
        p = self.params
        return p.prefill_intercept_s + p.prefill_s_per_1k_tokens * tokens / 1000

    def on_queue_blocked(self, view: StageView, program: ProgramView, now: float) -> Decisions:
        need = view.footprint_for_resume(program)
        for backend in sorted(view.healthy_backends(), key=lambda b: -view.room(b, self._high)):
            limit = backend.limit(self._high)
            if limit is None:
                continue
            shortfall = backend.reserved + need - limit
            victims: list[ProgramView] = []
            saved = cost = 0.0
            while shortfall > 0:
                victim = view.next_victim(backend, acting=True)
                if victim is None:
                    break
                victims.append(victim)
                remaining = self._ttl.remaining(victim, now) if self._ttl is not None else 0.0
                saved = max(saved, remaining)
                cost += self.recompute_s(victim.context_tokens)
                shortfall -= victim.reserved_tokens
            if shortfall <= 0 and victims and saved > cost:
                return [Pause(victim, "batch_gain_admit") for victim in victims]
            # not worth it here: the victims looked at stay as they were
        return ()


# ---------------------------------------------------------------------------- program_gate
class ProgramGate(Stage):
    """The vLLM router's count guard (`max_active_programs_per_target`) and waiting gate
    (`admission_waiting_request_threshold`): vetoes on admission and resume, besides the
    token watermarks of the admission stage (docs/program_scheduling.md of vllm-project/router)."""

    name = "program_gate"
    Params = ProgramGateParams
    params: ProgramGateParams

    def admits(
        self, view: StageView, program: ProgramView, backend: BackendView, tokens: int, now: float
    ) -> bool:
        cap = self.params.max_active_programs_per_target
        if cap is not None and view.programs_on(backend.label) >= cap:
            return False
        threshold = self.params.waiting_request_threshold
        waiting = backend.metrics.waiting
        return not (threshold and waiting is not None and waiting >= threshold)


# ---------------------------------------------------------------------------- program_binding
class ProgramBinding(Stage):
    """The vLLM router's `binding_strategy: consistent_hash` with `global_queue`: a new
    program is bound to the engine its id hashes to (rendezvous hashing: the same property
    as its virtual-node ring, losing an engine moves only its programs); admission and
    resume try the bound (previous) engine first, then another engine that passes the
    cross-rank headroom check; otherwise the program waits."""

    name = "program_binding"
    Params = ProgramBindingParams
    params: ProgramBindingParams

    def place(self, view: StageView, program: ProgramView, now: float) -> str | None:
        healthy = view.healthy_backends()
        labels = sorted(b.label for b in healthy)
        bound = program.backend or SessionAffinity.pick(program.program_id, labels)
        home = view.backends.get(bound) if bound else None
        if home is not None and home.healthy and view.admits(program, home, now):
            return home.label
        ratio = self.params.cross_rank_headroom_ratio
        if ratio is None:
            return ""
        need = ratio * view.footprint_for_resume(program)
        base = view.room(home) if home is not None and home.healthy else 0.0
        fitting = [
            b
            for b in healthy
            if b is not home and view.room(b) >= base + need and view.admits(program, b, now)
        ]
        return max(fitting, key=view.room).label if fitting else ""


BASELINE_STAGES: dict[str, type[Stage]] = {
    cls.name: cls
    for cls in (
        KvAware,
        SessionAffinity,
        Direct,
        ContinuumTtl,
        ProgressTtl,
        BatchGain,
        ProgramGate,
        ProgramBinding,
    )
}
