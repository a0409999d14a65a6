"""The discrete-event harness: the shipped scheduler core driving simulated engines in sim time.

N in-process `Engine`s and one `SchedulerCore` share one event queue. The harness drives
the core exactly as the live gateway does (middleware/live_scheduler.py): `on_request` for
every call a client sends (Forward: the engine gets it; Hold: it waits until a `Resumed`
action names its program; Reject: the program fails), `on_finished` with the engine's
usage when the call ends, `on_release` after the program's last call, `on_tick` every
second and `on_backend` with engine metrics every five. Engines step whenever they have
work; a step's results are delivered when its simulated duration has passed.

Metric definitions are in benchmarks/README.md; `RunResult.metrics` is the schema.
"""

from __future__ import annotations

import gc
import heapq
import math
from array import array
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from thunder_mw.benchmarks.workloads import ProgramSpec, growth_ids, system_ids
from thunder_mw.policies.core import (
    Action,
    BackendMetrics,
    Forward,
    Hold,
    Paused,
    Prefill,
    Reject,
    RequestInfo,
    Resumed,
    SchedulerCore,
)
from thunder_mw.policies.core_events import (
    BackendChanged,
    CallFinished,
    HostTierDeclared,
    ReleaseRequested,
    RequestArrived,
    Tick,
)
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Usage
from thunder_mw.policies.stats import percentile
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention
from thunder_mw.sim.engine import (
    PROGRAMS_REMEMBERED,
    Engine,
    EngineConfig,
    EngineStats,
    SamplingParams,
    Sequence,
)
from thunder_mw.sim.program_chains import ProgramChains
from thunder_mw.sim.tokenizer import RuleTokenizer

__all__ = [
    "CHARS_PER_BODY",
    "CHARS_PER_MESSAGE",
    "CHARS_PER_TOKEN",
    "Arrivals",
    "ClusterConfig",
    "RunResult",
    "Simulation",
    "simulate",
]

# What the live gateway's RequestInfo.prompt_chars would be: the JSON body's length. Text
# runs ~4 characters per token; each message adds its JSON envelope, the body its own.
CHARS_PER_TOKEN = 4
CHARS_PER_MESSAGE = 40
CHARS_PER_BODY = 200

# Event kinds, in the order same-instant events run: results first, then clients, then
# timers, and engine steps last so every request of an instant joins the same step.
_STEP_END, _SEND, _RELEASE, _TICK, _SCRAPE, _SAMPLE, _KICK = range(7)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The simulated fleet and the harness's clocks."""

    engines: int = 4
    kv_tokens: int = 131_072  # KV capacity per engine
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 65_536
    profile: str = "h100-8b"
    tick_s: float = 1.0  # a Tick event, as the live gateway's timer
    scrape_s: float = 5.0  # a BackendChanged event with engine metrics
    sample_s: float = 1.0  # KV usage time series and imbalance
    send_max_tokens: bool = True  # clients send max_tokens (+ ignore_eos): the field's method
    horizon_s: float = 24 * 3600.0  # programs unfinished by then count as failed
    # Seconds a call spends outside the engine's steps (HTTP, the API server process): added
    # to each call's round trip before the client sees its answer. 0 for GPU regimes, where
    # it is noise beside a step; measured on the real CPU engine (benchmarks/fit_cpu_profile).
    call_overhead_s: float = 0.0
    seed: int = 0
    # Further EngineConfig fields for every engine (e.g. the simulator's host KV tier),
    # as (name, value) pairs so the config stays hashable and picklable.
    engine_options: tuple[tuple[str, Any], ...] = ()
    # A mixed fleet: engine i's cost profile and KV tokens (empty: `profile`, `kv_tokens`).
    engine_profiles: tuple[str, ...] = ()
    engine_kv_tokens: tuple[int, ...] = ()
    # Scrapes carry the engine's prefill and decode counters (seconds and tokens), from
    # which admission learns what a recomputed token and a decode step cost. True is what
    # live does (engines/pool.py reads them from vLLM's metrics); False, the default the
    # committed results were made with, leaves them out, and the costs are learned from the
    # gateway's call timings instead (time to first token, which includes the engine's
    # queue: early in a run 7-25x the engine's own price).
    engine_counters: bool = False
    # What a scrape's `waiting` counts: "queue", the engine's waiting queue at the scrape
    # (the default the committed DES results were made with: it also counts requests that
    # arrived since the step began, which the next step takes in at once); "gauge", what
    # vLLM's `num_requests_waiting` says (the queue as the last step's schedule left it,
    # sim/engine.py), which the vLLM router's waiting gate reads. At a burst of arrivals the
    # two differ most: the queue shows the whole burst, the gauge none of it.
    waiting: Literal["queue", "gauge"] = "queue"

    def engine_config(self, i: int) -> EngineConfig:
        kv = self.engine_kv_tokens[i] if self.engine_kv_tokens else self.kv_tokens
        return EngineConfig(
            num_blocks=kv // self.block_size + 1,  # block 0 is the null block
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            profile=self.engine_profiles[i] if self.engine_profiles else self.profile,
            seed=self.seed + i,
            **dict(self.engine_options),
        )


def _counters(stats: EngineStats) -> dict[str, float]:
    """The engine's cost counters as live reads them from vLLM's metrics (engines/pool.py:
    `request_prefill_time_seconds` and `request_prefill_kv_computed_tokens` sums,
    `request_decode_time_seconds` sum, `generation_tokens`, `iteration_tokens_total`'s
    count, `inter_token_latency_seconds` sum and count), in simulated seconds."""
    return {
        "prefill_seconds_total": stats.request_prefill_seconds,
        "prefill_tokens_total": float(stats.request_prefill_kv_computed_tokens),
        "decode_seconds_total": stats.request_decode_seconds,
        "decode_tokens_total": float(stats.generation_tokens),
        "steps_total": float(stats.steps),
        "inter_token_seconds_total": stats.inter_token_seconds,
        "inter_tokens_total": float(stats.inter_tokens),
    }


@dataclass(frozen=True, slots=True)
class Arrivals:
    """How clients start programs: `batch` (all at t=0), `staggered` (each at its
    `arrival_s`), or `closed` (at most `concurrency` top-level programs at a time, the next
    starting when one ends).

    A closed loop's steady-state window opens once `warmup_programs` top-level programs have
    finished (default: half the concurrency, so the synchronised first wave has mixed) and
    closes when the last program starts (from then on concurrency only falls).
    `stop_at_window_end` ends the run there: the drain after it measures nothing steady (JCT
    figures then cover the programs finished by then, and the rest count as unfinished).
    Calls in flight at the window's open and close count pro rata (output tokens produced
    over the call's output length), so a cut never drops or doubles the work in flight.

    `burst` > 1 (closed loop): finished programs' places are refilled only once `burst` of
    them are free, all at the same instant: arrivals in bursts, like a rollout driver that
    launches a group of programs at once."""

    mode: str = "batch"
    concurrency: int | None = None
    warmup_programs: int | None = None
    stop_at_window_end: bool = False
    burst: int = 1

    def __post_init__(self) -> None:
        if self.mode not in ("batch", "staggered", "closed"):
            raise ValueError(f"unknown arrival mode {self.mode!r}")
        if self.mode == "closed" and not self.concurrency:
            raise ValueError("closed arrivals need a concurrency")
        if self.burst < 1 or (self.concurrency and self.burst > self.concurrency):
            raise ValueError(f"burst {self.burst} must be within 1 and the concurrency")


@dataclass
class RunResult:
    policy: str
    metrics: dict[str, Any]
    jct_s: list[float]
    ttft_s: list[float]
    timeseries: dict[str, Any]
    counters: dict[str, int]


class _Listener:
    """Makes the engine report first tokens (StepResult.progressed); the harness reads them."""

    __slots__ = ()

    def on_progress(self, seq: Sequence) -> None: ...

    def on_finish(self, seq: Sequence) -> None: ...


_LISTENER = _Listener()


class _Program:
    """A client running one program: its context so far and where its current call is."""

    __slots__ = (
        "arrived_at",
        "call",
        "ctx",
        "done_at",
        "failed",
        "first_token_at",
        "forwarded_at",
        "held",
        "held_s",
        "held_since",
        "prompt",
        "sent_at",
        "seq",
        "spec",
        "subs_pending",
        "tool_pending",
    )

    def __init__(self, spec: ProgramSpec) -> None:
        self.spec = spec
        self.ctx = AgentContext(
            program_id=spec.program_id,
            source=Convention.THUNDERAGENT,
            session_type=spec.session_type,
            parent_program_id=spec.parent_id,
        )
        self.call = 0
        self.prompt: array[int] = array("I")  # workloads' ids; 4 bytes each
        self.seq: Sequence | None = None  # the call in an engine now
        self.arrived_at = 0.0
        self.sent_at = 0.0
        self.first_token_at: float | None = None
        self.forwarded_at = 0.0
        self.held = False
        self.held_since = 0.0
        self.held_s = 0.0
        self.done_at: float | None = None
        self.failed = False
        self.subs_pending = 0
        self.tool_pending = False


class _Backend:
    __slots__ = ("busy", "engine", "kick_pending", "label", "seen_types")

    def __init__(self, label: str, engine: Engine) -> None:
        self.label = label
        self.engine = engine
        self.busy = False
        self.kick_pending = False
        self.seen_types: set[str] = set()


@contextmanager
def _rare_collections(young: int = 50_000) -> Iterator[None]:
    """The cyclic collector run about 70x less often during a run: a run makes millions of
    short-lived objects (a step's result, its lists), and at Python's default threshold (700
    allocations) the collector ran every few hundred steps, the older generations with it
    one time in ten and a hundred (4-9 % of a large run's time, ad hoc). Nothing here depends
    on when cycles go (no weak references or finalizers), so the results are the same; the
    threshold is restored after the run."""
    before = gc.get_threshold()
    gc.set_threshold(young, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


class Simulation:
    """One run: a workload, a fleet, a pipeline. `run()` returns the metrics."""

    def __init__(
        self,
        programs: Iterable[ProgramSpec],
        pipeline: list[dict[str, Any]] | None,
        cluster: ClusterConfig = ClusterConfig(),
        arrivals: Arrivals = Arrivals(),
        policy: str = "",
        on_action: Callable[[Action], None] | None = None,
        on_decision: Callable[[str, int, Forward | Hold | Reject], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.arrivals = arrivals
        self.policy = policy
        self.on_action = on_action
        # (program id, call index, the core's decision on that call's request), at `now`:
        # for tools that follow one run's holds (lab/real_holds.py); nothing else reads it.
        self.on_decision = on_decision
        filler = RuleTokenizer().filler_ids
        # One registry of hash chains: a program moved to another engine is not hashed again.
        chains = ProgramChains[Sequence](
            cluster.block_size, filler, PROGRAMS_REMEMBERED * cluster.engines
        )
        self.backends = {
            f"e{i}": _Backend(f"e{i}", Engine(cluster.engine_config(i), filler, chains=chains))
            for i in range(cluster.engines)
        }
        self.core = SchedulerCore(
            [(b.label, b.engine.capacity_tokens) for b in self.backends.values()],
            build_pipeline(pipeline),
        )
        for b in self.backends.values():
            tier = b.engine.host_tier
            if tier is not None:
                # As a config's `host_kv_tokens` declares it (the host tier; a disk below it
                # holds more but reloads slower: planning counts the host tier only).
                tokens = tier.capacity_blocks * cluster.block_size
                self.core.handle(HostTierDeclared(b.label, tokens, tier.load_tokens_per_s))
        self.top = list(programs)
        self.runs: dict[str, _Program] = {}
        self.now = 0.0
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._system: dict[str, array[int]] = {}
        self._next_top = 0
        self._active_top = 0
        self._open = 0  # programs started and not yet done
        # accounting
        self.first_time_tokens = 0
        self.prefill_tokens = 0
        self.output_tokens = 0
        self.steps_done = 0
        self.calls_failed = 0
        self.ttft: list[float] = []
        self.pauses = 0
        self.speculative_prefills = 0
        self.held_requests = 0
        self._imbalance_sum = 0.0
        self._resident: list[int] = []  # Σ prompt tokens of open programs, per sample
        # The same sum now, kept as contexts grow: summed at each sample, it walked every
        # open program (~190 µs a sample with 3,000 of them).
        self._resident_now = 0
        self._open_runs: set[_Program] = set()
        self._batch_time = 0.0  # Σ decoding sequences x step duration
        self._busy_time = 0.0
        self._steps_at_last_start: int | None = None
        self._last_start = 0.0
        self._output_at_last_start = 0
        self._top_finished = 0
        # t, steps, output, finished (at the window's open), steps and output in flight then
        self._warm: tuple[float, int, int, int, float, int] | None = None
        self._top_finished_at_last_start = 0
        self._in_flight_at_last_start: tuple[float, int] = (0.0, 0)
        self._free_places = 0  # closed loop with bursts: places freed, not yet refilled
        self._imbalance_n = 0
        self._series_t: list[float] = []
        self._series_kv: dict[str, list[float]] = {label: [] for label in self.backends}

    # ------------------------------------------------------------------ event queue
    def _at(self, t: float, kind: int, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, payload))

    def run(self) -> RunResult:
        with _rare_collections():
            return self._run()

    def _run(self) -> RunResult:
        self._start_clients()
        self._at(0.0, _TICK)
        self._at(0.0, _SCRAPE)
        self._at(0.0, _SAMPLE)
        events = self._events
        pop = heapq.heappop
        horizon = self.cluster.horizon_s
        handlers = (
            self._on_step_end,
            self._on_send,
            self._on_release,
            self._on_tick,
            self._on_scrape,
            self._on_sample,
            self._on_kick,
        )
        stop = self.arrivals.stop_at_window_end
        while events and self._open:
            t, kind, _, payload = pop(events)
            if t > horizon:
                break
            self.now = t
            handlers[kind](payload)
            if stop and self._steps_at_last_start is not None:
                break  # the steady window closed: the drain measures nothing steady
        return self._result()

    # ------------------------------------------------------------------ clients
    def _start_clients(self) -> None:
        mode = self.arrivals.mode
        if mode == "closed":
            for _ in range(min(self.arrivals.concurrency or 0, len(self.top))):
                self._start_next(0.0)
        else:
            for spec in self.top:
                self._start(spec, 0.0 if mode == "batch" else spec.arrival_s)
            self._next_top = len(self.top)

    def _start_next(self, t: float) -> None:
        if self._next_top < len(self.top):
            spec = self.top[self._next_top]
            self._next_top += 1
            self._start(spec, t)
            if self._next_top == len(self.top):
                # The pool is empty: concurrency only falls from here (the steady window ends).
                self._steps_at_last_start = self.steps_done
                self._output_at_last_start = self.output_tokens
                self._top_finished_at_last_start = self._top_finished
                self._in_flight_at_last_start = self._in_flight()
                self._last_start = t

    def _in_flight(self) -> tuple[float, int]:
        """Calls in engines now, pro rata: Σ output produced / output length, Σ output."""
        steps = 0.0
        output = 0
        for run in self._open_runs:
            seq = run.seq
            if seq is not None and seq.num_output:
                steps += seq.num_output / max(1, run.spec.calls[run.call].output_tokens)
                output += seq.num_output
        return steps, output

    def _start(self, spec: ProgramSpec, t: float) -> None:
        run = _Program(spec)
        run.arrived_at = t
        self.runs[spec.program_id] = run
        self._open += 1
        self._open_runs.add(run)
        if spec.parent_id is None:
            self._active_top += 1
        self._at(t + spec.start_s, _SEND, run)

    def _on_send(self, run: _Program) -> None:
        spec = run.spec
        call = spec.calls[run.call]
        before = len(run.prompt)
        if run.call == 0 or call.reset:
            system = self._system_prompt(spec)
            run.prompt = system + growth_ids(spec.program_id, run.call, call.growth_tokens)
        else:
            run.prompt.extend(growth_ids(spec.program_id, run.call, call.growth_tokens))
        if run in self._open_runs:
            self._resident_now += len(run.prompt) - before
        run.sent_at = self.now
        run.first_token_at = None
        n = len(run.prompt)
        chars = n * CHARS_PER_TOKEN + (2 * run.call + 2) * CHARS_PER_MESSAGE + CHARS_PER_BODY
        max_tokens = call.output_tokens if self.cluster.send_max_tokens else None
        # The shared prefix is the session type's system prompt (what the live gateway keys
        # by the request's system message).
        prefix = f"{spec.session_type}:{spec.system_tokens}"
        info = RequestInfo(chars, max_tokens, prefix, spec.system_tokens * CHARS_PER_TOKEN)
        outcome = self.core.handle(RequestArrived(run.ctx, info, self.now))
        self._apply(outcome.actions)
        decision = outcome.decision
        assert decision is not None, "a request event always gets a decision"
        if self.on_decision is not None:
            self.on_decision(spec.program_id, run.call, decision)
        if isinstance(decision, Forward):
            self._dispatch(run, decision.backend, decision.kv_ttl_s)
        elif isinstance(decision, Hold):
            run.held = True
            run.held_since = self.now
            self.held_requests += 1
        else:
            assert isinstance(decision, Reject)
            self._fail(run, release=True)

    def _system_prompt(self, spec: ProgramSpec) -> array[int]:
        key = f"{spec.session_type}:{spec.system_tokens}"
        ids = self._system.get(key)
        if ids is None:
            ids = self._system[key] = system_ids(spec.session_type, spec.system_tokens)
        return ids

    def _dispatch(self, run: _Program, label: str, kv_ttl_s: float | None = None) -> None:
        backend = self.backends[label]
        engine = backend.engine
        spec = run.spec
        call = spec.calls[run.call]
        params = _sampling_params(call.output_tokens, kv_ttl_s)
        error = engine.validate(run.prompt, params)
        if error is not None:
            self.calls_failed += 1
            self._apply(
                self.core.handle(CallFinished(spec.program_id, None, False, self.now)).actions
            )
            self._fail(run, release=True)
            return
        # Tokens no cache could have held: the new growth, the previous answer's last token
        # (sampled, never computed), and a session type's system prompt once per engine.
        if run.call == 0 or call.reset:
            new = len(run.prompt) - spec.system_tokens
            key = f"{spec.session_type}:{spec.system_tokens}"
            if key not in backend.seen_types:
                backend.seen_types.add(key)
                new += spec.system_tokens
        else:
            new = call.growth_tokens + 1
        self.first_time_tokens += new
        run.forwarded_at = self.now
        engine.advance(self.now)  # the engine's clock (TTL pins) follows simulated time
        seq = engine.add_request(
            f"{spec.program_id}#{run.call}",
            run.prompt,
            params,
            listener=_LISTENER,
            program_id=spec.program_id,
        )
        seq.user_data = run
        run.seq = seq
        if not backend.busy and not backend.kick_pending:
            backend.kick_pending = True
            self._at(self.now, _KICK, backend)

    def _fail(self, run: _Program, release: bool) -> None:
        if run.done_at is not None:
            return
        run.failed = True
        run.held = False
        if release:
            released = ReleaseRequested(run.spec.program_id, "release", self.now)
            self._apply(self.core.handle(released).actions)
        self._finish_program(run)

    def _finish_program(self, run: _Program) -> None:
        run.done_at = self.now
        self._open -= 1
        if run in self._open_runs:
            self._open_runs.remove(run)
            self._resident_now -= len(run.prompt)
        spec = run.spec
        if spec.parent_id is None:
            self._active_top -= 1
            self._top_finished += 1
            warmup = self.arrivals.warmup_programs or (self.arrivals.concurrency or 0) // 2
            if self._warm is None and self._top_finished >= warmup:
                steps, output = self._in_flight()
                self._warm = (
                    self.now,
                    self.steps_done,
                    self.output_tokens,
                    self._top_finished,
                    steps,
                    output,
                )
            if self.arrivals.mode == "closed":
                self._free_places += 1
                left = len(self.top) - self._next_top
                if self._free_places >= min(self.arrivals.burst, max(1, left)):
                    for _ in range(self._free_places):
                        self._start_next(self.now)
                    self._free_places = 0
        else:
            parent = self.runs.get(spec.parent_id)
            if parent is not None and parent.done_at is None:
                parent.subs_pending -= 1
                self._maybe_continue(parent)

    def _maybe_continue(self, run: _Program) -> None:
        if not run.tool_pending and run.subs_pending == 0 and run.done_at is None:
            self._at(self.now, _SEND, run)

    def _on_release(self, payload: Any) -> None:
        if isinstance(payload, tuple):  # a tool that ran alongside sub-agents ended
            run = payload[1]
            run.tool_pending = False
            self._maybe_continue(run)
            return
        run = payload
        released = ReleaseRequested(run.spec.program_id, "release", self.now)
        self._apply(self.core.handle(released).actions)
        self._finish_program(run)

    # ------------------------------------------------------------------ the core's actions
    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Resumed):
                run = self.runs.get(action.program_id)
                if run is not None and run.held:
                    run.held = False
                    run.held_s += self.now - run.held_since
                    self._dispatch(run, action.backend, action.kv_ttl_s)
            elif isinstance(action, Reject):
                run = self.runs.get(action.program_id)
                if run is not None and run.held:
                    run.held_s += self.now - run.held_since
                    self.calls_failed += 1
                    self._fail(run, release=False)
            elif isinstance(action, Paused):
                if not action.pending:
                    self.pauses += 1
            elif isinstance(action, Prefill):
                self._speculative_prefill(action)
            if self.on_action is not None:
                self.on_action(action)

    def _speculative_prefill(self, action: Prefill) -> None:
        """As the live gateway does (middleware/speculative_prefill.py): the program's last
        prompt and answer, one output token, on the engine named; not a step of the program."""
        run = self.runs.get(action.program_id)
        backend = self.backends.get(action.backend)
        if run is None or backend is None or run.done_at is not None or run.call == 0:
            return
        engine = backend.engine
        params = _sampling_params(1, None)
        if engine.validate(run.prompt, params) is not None:
            return
        self.speculative_prefills += 1
        engine.advance(self.now)
        seq = engine.add_request(
            f"{action.program_id}#prefill{self.speculative_prefills}",
            run.prompt[:],
            params,
            listener=_LISTENER,
            program_id=action.program_id,
        )
        seq.user_data = None  # no client waits for it
        if not backend.busy and not backend.kick_pending:
            backend.kick_pending = True
            self._at(self.now, _KICK, backend)

    # ------------------------------------------------------------------ engines
    def _on_kick(self, backend: _Backend) -> None:
        backend.kick_pending = False
        if not backend.busy:
            self._step(backend)

    def _step(self, backend: _Backend) -> None:
        engine = backend.engine
        events = self._events
        while True:
            engine.advance(self.now)
            result = engine.step()
            if result is None:
                return
            backend.busy = True
            self.prefill_tokens += result.prefill_tokens
            self._batch_time += result.decode_seqs * result.duration
            self._busy_time += result.duration
            t = self.now + result.duration
            if (
                result.progressed
                or result.finished
                or not events
                or t >= events[0][0]
                or t > self.cluster.horizon_s
                or backend.kick_pending
                or (self.arrivals.stop_at_window_end and self._steps_at_last_start is not None)
            ):
                self._at(t, _STEP_END, (backend, result))
                return
            # Its end would be the next event (no other comes first, nor at the same time),
            # and `_on_step_end` would only step again (nothing progressed or finished):
            # done here, without the queue (most steps of a run with one engine).
            self.now = t
            backend.busy = False

    def _on_step_end(self, payload: Any) -> None:
        backend, result = payload
        backend.busy = False
        now = self.now
        for seq in result.progressed:
            run = seq.user_data
            if run is not None and run.first_token_at is None:
                run.first_token_at = now
        for seq in result.finished:
            run = seq.user_data
            if run is not None and run.done_at is None:
                self._call_done_on(run, seq, backend)
        if not backend.kick_pending:
            # The engine loop runs on at once: what this step's results released (resumed
            # programs' requests) is already queued and joins the next step.
            self._step(backend)

    def _call_done_on(self, run: _Program, seq: Sequence, backend: _Backend) -> None:
        spec = run.spec
        call = spec.calls[run.call]
        run.seq = None
        self.steps_done += 1
        self.output_tokens += seq.num_output
        if run.first_token_at is None:
            run.first_token_at = self.now
        # The gateway's timing of the call, as the live forwarder measures a streamed one.
        usage = Usage(
            seq.prompt_len,
            seq.num_output,
            max(seq.num_cached_tokens, 0),
            ttft_s=run.first_token_at - run.forwarded_at,
            duration_s=self.now - run.forwarded_at,
        )
        self._apply(self.core.handle(CallFinished(spec.program_id, usage, True, self.now)).actions)
        self.ttft.append(run.first_token_at - run.sent_at)
        back = self.now + self.cluster.call_overhead_s  # when the client has the answer
        if run.call + 1 >= len(spec.calls):
            self._at(back, _RELEASE, run)
            return
        answer = backend.engine.output_ids(seq)
        run.prompt.extend(answer)
        if run in self._open_runs:
            self._resident_now += len(answer)
        run.call += 1
        if call.subagents:
            run.tool_pending = True
            for sub in call.subagents:
                run.subs_pending += 1
                self._start(sub, back)
            self._at(back + call.tool_s, _RELEASE, ("tool", run))
        else:
            self._at(back + call.tool_s, _SEND, run)

    # ------------------------------------------------------------------ timers
    def _on_tick(self, _: Any) -> None:
        self._apply(self.core.handle(Tick(self.now)).actions)
        self._at(self.now + self.cluster.tick_s, _TICK)

    def _on_scrape(self, _: Any) -> None:
        for backend in self.backends.values():
            engine = backend.engine
            stats = engine.stats
            metrics = BackendMetrics(
                kv_usage=engine.pool.usage(),
                running=engine.num_running,
                waiting=engine.num_waiting
                if self.cluster.waiting == "queue"
                else engine.waiting_after_schedule,
                preemptions_total=float(stats.num_preemptions),
                prefix_hits_total=float(stats.prefix_cache_hits),
                prefix_queries_total=float(stats.prefix_cache_queries),
                **(_counters(stats) if self.cluster.engine_counters else {}),
            )
            changed = BackendChanged(backend.label, self.now, metrics=metrics)
            self._apply(self.core.handle(changed).actions)
        self._at(self.now + self.cluster.scrape_s, _SCRAPE)

    def _on_sample(self, _: Any) -> None:
        usages = []
        for label, backend in self.backends.items():
            u = backend.engine.pool.usage()
            usages.append(u)
            self._series_kv[label].append(u)
        self._series_t.append(self.now)
        self._imbalance_sum += max(usages) - min(usages)
        self._resident.append(self._resident_now)
        self._imbalance_n += 1
        self._at(self.now + self.cluster.sample_s, _SAMPLE)

    # ------------------------------------------------------------------ results
    def _result(self) -> RunResult:
        runs = list(self.runs.values())
        truncated = self.arrivals.stop_at_window_end and self._steps_at_last_start is not None
        unfinished = 0
        for run in runs:  # still open at the horizon (or when the steady window closed)
            if run.done_at is None:
                unfinished += 1
                run.failed = not truncated
                if run.held:
                    run.held_s += self.now - run.held_since
        finished = [r for r in runs if r.done_at is not None]
        top_done = [r for r in finished if r.spec.parent_id is None and not r.failed]
        completed = [r for r in finished if not r.failed]
        never_started = len(self.top) - self._next_top
        jct = sorted(r.done_at - r.arrived_at for r in top_done if r.done_at is not None)
        ends = [r.done_at for r in finished if r.done_at is not None]
        makespan = self.now if truncated else max(ends, default=self.now)
        stats = [b.engine.stats for b in self.backends.values()]
        hits = sum(s.prefix_cache_hits for s in stats)
        queries = sum(s.prefix_cache_queries for s in stats)
        ttft = sorted(self.ttft)
        minutes = makespan / 60 if makespan > 0 else math.inf
        median_jct = percentile(jct, 50) if jct else None
        steady = self._steady_window()
        capacity = sum(b.engine.capacity_tokens for b in self.backends.values())
        # Offered load while every client is busy (closed loop: until the pool ran dry).
        full = len(self._series_t)
        if self._last_start > 0:
            full = sum(1 for t in self._series_t if t <= self._last_start)
        resident = self._resident[: max(1, full)]
        metrics: dict[str, Any] = {
            "steps_per_min": round(self.steps_done / minutes, 2),
            **steady,
            "output_tokens_per_s": round(self.output_tokens / makespan, 1) if makespan else 0.0,
            "jct_mean_s": round(sum(jct) / len(jct), 2) if jct else None,
            "jct_p50_s": _r(median_jct),
            "jct_p95_s": _r(percentile(jct, 95)) if jct else None,
            "jct_p99_s": _r(percentile(jct, 99)) if jct else None,
            "jct_max_s": _r(jct[-1] if jct else None),
            "jct_max_over_median": round(jct[-1] / median_jct, 2) if jct and median_jct else None,
            "ttft_p50_s": _r(percentile(ttft, 50), 3) if ttft else None,
            "ttft_p99_s": _r(percentile(ttft, 99), 3) if ttft else None,
            "ttft_max_s": _r(ttft[-1] if ttft else None, 3),
            "prefix_hit_rate": round(hits / queries, 4) if queries else 0.0,
            "prefix_hit_rate_ideal": round(1 - self.first_time_tokens / queries, 4)
            if queries
            else 0.0,
            "prefill_tokens": self.prefill_tokens,
            "first_time_tokens": self.first_time_tokens,
            "recomputed_prefill_tokens": self.prefill_tokens - self.first_time_tokens,
            "preemptions": sum(s.num_preemptions for s in stats),
            "paused_time_s": round(sum(r.held_s for r in runs), 1),
            "held_requests": self.held_requests,
            "pauses": self.pauses,
            "speculative_prefills": self.speculative_prefills,
            "migrations": self.core.counts().get("migrations", 0),
            "kv_imbalance": round(self._imbalance_sum / self._imbalance_n, 4)
            if self._imbalance_n
            else 0.0,
            "resident_to_capacity": round(sum(resident) / max(1, len(resident)) / capacity, 3),
            "resident_to_capacity_peak": round(max(self._resident, default=0) / capacity, 3),
            "mean_batch": round(self._batch_time / self._busy_time, 2) if self._busy_time else 0.0,
            "engine_busy": round(self._busy_time / (makespan * len(self.backends)), 3)
            if makespan
            else 0.0,
            "programs_completed": len(completed),
            "programs_failed": len(runs)
            - len(completed)
            + never_started
            - (unfinished if truncated else 0),
            "programs_unfinished": unfinished if truncated else 0,
            "steps": self.steps_done,
            "output_tokens": self.output_tokens,
            "makespan_s": round(makespan, 1),
        }
        return RunResult(
            policy=self.policy,
            metrics=metrics,
            jct_s=[round(x, 3) for x in jct],
            ttft_s=ttft,
            timeseries=self._timeseries(),
            counters=dict(self.core.counts()),
        )

    def _steady_window(self) -> dict[str, Any]:
        """Throughput at full concurrency after warm-up (see `Arrivals`); None without one."""
        warm, end = self._warm, self._last_start
        if warm is None or self._steps_at_last_start is None or end <= warm[0]:
            return {
                "steps_per_min_steady": None,
                "output_tokens_per_s_steady": None,
                "steady_window_s": 0.0,
                "steady_programs_done": 0,
                "warmup_s": round(warm[0], 1) if warm else None,
            }
        span = end - warm[0]
        steps_end, output_end = self._in_flight_at_last_start
        steps = self._steps_at_last_start + steps_end - warm[1] - warm[4]
        output = self._output_at_last_start + output_end - warm[2] - warm[5]
        return {
            "steps_per_min_steady": round(60 * steps / span, 2),
            "output_tokens_per_s_steady": round(output / span, 1),
            "steady_window_s": round(span, 1),
            "steady_programs_done": self._top_finished_at_last_start - warm[3],
            "warmup_s": round(warm[0], 1),
        }

    def _timeseries(self, max_points: int = 400) -> dict[str, Any]:
        t = self._series_t
        stride = max(1, math.ceil(len(t) / max_points))
        return {
            "t_s": [round(x, 1) for x in t[::stride]],
            "kv_usage": {k: [round(u, 4) for u in v[::stride]] for k, v in self._series_kv.items()},
        }


def _sampling_params(max_tokens: int, kv_ttl_s: float | None) -> SamplingParams:
    """Fixed output length (max_tokens + ignore_eos), and the TTL pin a stage asked for."""
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, kv_ttl_s=kv_ttl_s)


def _r(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


def simulate(
    programs: Iterable[ProgramSpec],
    pipeline: list[dict[str, Any]] | None,
    cluster: ClusterConfig = ClusterConfig(),
    arrivals: Arrivals = Arrivals(),
    policy: str = "",
) -> RunResult:
    """Run one policy over one workload on one simulated fleet."""
    return Simulation(programs, pipeline, cluster, arrivals, policy).run()
