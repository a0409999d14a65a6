"""Cost-aware overflow: hold a program that does not fit, or admit it past the KV capacity?

Holding keeps the engine's cache intact but narrows its batch: the held program makes no
progress for the hold time. Admitting past capacity keeps the batch wide but the engine
evicts (LRU: the most idle programs' KV goes first) and later recomputes, or reloads from a
host tier, what no longer fits: every recomputed token stalls each step of the whole batch.
This module learns, per engine, what those cost and says which is cheaper:

- seconds of engine time per recomputed prompt token `p`, from the engine's own counters
  or, where it has none, from the gateway's timings of calls (time to first token, less one
  decode step, over the prompt tokens the engine did not have cached). From the counters,
  by regression once enough scrapes vary (`StepFit`): each scrape interval's mean step
  time as decoding sequences see it (vLLM's inter-token latency sum over its count) against
  its prompt tokens computed per step (prefix-cache queries less hits, over the steps of
  `iteration_tokens_total`); the slope is what one more prefill token adds to a step, i.e.
  to every sequence in the batch. Until then, `request_prefill_time_seconds` over
  `request_prefill_kv_computed_tokens`, which overstates it (about 2x in the simulator's
  8B fleets): a request's prefill time counts every step its chunks ran in, the batch's
  decoding and other requests' prefills included;
- seconds per decode step `t_step` (vLLM: `request_decode_time_seconds` over generation
  tokens; else the call's time after its first token over its output tokens);
- seconds a held program waits for room `H` (the queue's observed waits; until one is seen,
  the program's expected tool time: room appears when a tool-running program ends);
- seconds per token reloaded from a host KV tier `p_host` (declared, or the engine's report).

Rule, per program of footprint F that would take a backend past its high watermark, on an
engine running a batch of B sequences, with cycle time T (its expected tool time plus the
engine's mean call time) and expected hold H: admit it past capacity iff
    F * p_eff * B < min(H, T),
where p_eff = p_host while the overflow fits the host tier and p otherwise, and the total
overflow stays within the host tier plus `max_overflow` x capacity (beyond the idle programs'
evictable KV the engine would preempt running sequences, which recompute whole contexts),
and the programs with a call in the engine still fit its GPU cache by themselves, now and on
average (reserved x duty <= capacity, duty = mean call time / (call + tool time)). With
AdmissionParams `tier_reload` (off by default), an overflow the host tier holds drops those
two caps and pays its reload alone (`tier_pays`).
Why: holding costs the batch one sequence for H seconds. Admitting costs, per cycle while the
overflow lasts (about H), the recompute of about F tokens (an LRU cache smaller than a cyclic
working set misses whole contexts, not just the excess), each stalling all B sequences:
F * p * B * max(1, H / T) sequence-seconds; compared with H that is the rule above.
Pure: every input arrives with `now`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from thunder_mw.policies.estimates import ema

__all__ = [
    "COST_EMA_ALPHA",
    "FIT_DECAY",
    "FIT_MIN_CV",
    "FIT_MIN_STEPS",
    "FIT_MIN_WEIGHT",
    "MIN_PREFILL_SAMPLE_TOKENS",
    "Counters",
    "EngineCosts",
    "OverflowView",
    "StepFit",
    "admit_past_capacity",
    "allowance",
    "budget",
    "duty",
    "keeps_idle_context",
    "move_pays",
    "tier_has_room",
    "tier_pays",
]

# Calls shorter than this many uncached prompt tokens say too little about the per-token cost
# (the step's fixed cost dominates their time to first token).
MIN_PREFILL_SAMPLE_TOKENS = 256
COST_EMA_ALPHA = 0.2
# The regression's memory: each scrape interval's weight decays by this per interval after
# it (a half-life of ~34 intervals), so the price follows the workload as an EMA does.
FIT_DECAY = 0.98
# An interval of fewer engine steps says too little (one step's noise is its mean); the fit
# answers once its intervals weigh this much, and while their prefill tokens per step vary
# by at least FIT_MIN_CV of their mean (a slope needs a spread of x).
FIT_MIN_STEPS = 5
FIT_MIN_WEIGHT = 8.0
FIT_MIN_CV = 0.1


@dataclass(slots=True)
class Counters:
    """The last values of an engine's cumulative counters (deltas are what is learned)."""

    prefill_s: float | None = None
    prefill_tokens: float | None = None
    decode_s: float | None = None
    decode_tokens: float | None = None
    steps: float | None = None
    inter_token_s: float | None = None
    inter_tokens: float | None = None
    computed: float | None = None


@dataclass(slots=True)
class StepFit:
    """Exponentially weighted least squares of a scrape interval's mean step time `y` on its
    prompt tokens computed per step `x`: y = t0 + p x, p the marginal price of a prefill
    token. Why a regression: per-request prefill times charge a shared step to every
    request in it, and a step's time to every token in it; only how step time moves with
    the prefill load separates the prefill's share from the batch's decoding."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float) -> None:
        d = FIT_DECAY
        self.w = self.w * d + 1.0
        self.x = self.x * d + x
        self.y = self.y * d + y
        self.xx = self.xx * d + x * x
        self.xy = self.xy * d + x * y

    def slope(self) -> float | None:
        """p, once the intervals weigh enough and their x spread; None: not (yet), or a
        slope that is not positive (no prefill price to learn from noise)."""
        if self.w < FIT_MIN_WEIGHT:
            return None
        spread = self.w * self.xx - self.x * self.x  # w² x variance
        if spread <= (FIT_MIN_CV * self.x) ** 2:
            return None
        p = (self.w * self.xy - self.x * self.y) / spread
        return p if p > 0 else None


@dataclass(slots=True)
class EngineCosts:
    """What one engine's recomputed token, decode step and hold cost, learned online."""

    prefill_s_per_token: float | None = None
    decode_step_s: float | None = None
    hold_s: float | None = None
    call_s: float | None = None  # a forwarded call's duration on this engine
    host_s_per_token: float | None = None  # declared (or reported) host-tier reload cost
    samples: int = 0
    from_engine: bool = False  # the engine's own counters seen: call timings only fill gaps
    _last: Counters = field(default_factory=Counters)
    _ratio: float | None = None  # per-request prefill seconds over tokens (an EMA)
    _fit: StepFit = field(default_factory=StepFit)

    def observe_call(
        self,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        ttft_s: float | None,
        duration_s: float | None,
    ) -> None:
        """One call the gateway timed (ttft: first token after forwarding; None: not
        streamed, so its first byte is its last)."""
        if duration_s is not None and duration_s >= 0:
            self.call_s = ema(self.call_s, duration_s, COST_EMA_ALPHA)
        if ttft_s is None or duration_s is None or ttft_s < 0 or duration_s < ttft_s:
            return
        if completion_tokens > 1 and not self.from_engine:
            step = (duration_s - ttft_s) / (completion_tokens - 1)
            self.decode_step_s = ema(self.decode_step_s, step, COST_EMA_ALPHA)
        computed = prompt_tokens - cached_tokens
        if computed >= MIN_PREFILL_SAMPLE_TOKENS and not self.from_engine:
            # Its first token came with a step that also decoded the batch: take one off.
            prefill = max(0.0, ttft_s - (self.decode_step_s or 0.0))
            self.prefill_s_per_token = ema(
                self.prefill_s_per_token, prefill / computed, COST_EMA_ALPHA
            )
            self.samples += 1

    def observe_counters(
        self,
        prefill_s: float | None,
        prefill_tokens: float | None,
        decode_s: float | None,
        decode_tokens: float | None,
        steps: float | None = None,
        inter_token_s: float | None = None,
        inter_tokens: float | None = None,
        computed: float | None = None,
    ) -> None:
        """Cumulative engine counters (a restart, seen as a counter going back, re-bases).
        `steps`, `inter_token_s` / `inter_tokens` and `computed` (prompt tokens computed:
        prefix-cache queries less hits) feed the regression (`StepFit`)."""
        last = self._last
        if prefill_s is not None and prefill_tokens is not None:
            if last.prefill_s is not None and last.prefill_tokens is not None:
                dt, dn = prefill_s - last.prefill_s, prefill_tokens - last.prefill_tokens
                if dt >= 0 and dn >= MIN_PREFILL_SAMPLE_TOKENS:
                    per_token = dt / dn
                    old = self._ratio if self.from_engine else self.prefill_s_per_token
                    self._ratio = ema(old, per_token, COST_EMA_ALPHA)
                    self.prefill_s_per_token = self._ratio
                    self.samples += 1
                    self.from_engine = True
            last.prefill_s, last.prefill_tokens = prefill_s, prefill_tokens
        self._observe_steps(steps, inter_token_s, inter_tokens, computed)
        slope = self._fit.slope()
        if slope is not None:
            self.prefill_s_per_token = slope
        if decode_s is not None and decode_tokens is not None:
            if last.decode_s is not None and last.decode_tokens is not None:
                dt, dn = decode_s - last.decode_s, decode_tokens - last.decode_tokens
                if dt >= 0 and dn > 0:
                    self.decode_step_s = ema(self.decode_step_s, dt / dn, COST_EMA_ALPHA)
            last.decode_s, last.decode_tokens = decode_s, decode_tokens

    def _observe_steps(
        self,
        steps: float | None,
        inter_token_s: float | None,
        inter_tokens: float | None,
        computed: float | None,
    ) -> None:
        """One scrape interval's point for the regression: (prompt tokens computed per step,
        mean inter-token latency)."""
        if steps is None or inter_token_s is None or inter_tokens is None or computed is None:
            return
        last = self._last
        if (
            last.steps is not None
            and last.inter_token_s is not None
            and last.inter_tokens is not None
            and last.computed is not None
        ):
            n = steps - last.steps
            tokens = inter_tokens - last.inter_tokens
            seconds = inter_token_s - last.inter_token_s
            prompt = computed - last.computed
            if n >= FIT_MIN_STEPS and tokens > 0 and seconds >= 0 and prompt >= 0:
                self._fit.add(prompt / n, seconds / tokens)
        last.steps, last.inter_token_s = steps, inter_token_s
        last.inter_tokens, last.computed = inter_tokens, computed

    def observe_hold(self, waited_s: float) -> None:
        """A queued program was placed on this engine after waiting this long."""
        if waited_s > 0:  # placed in the event it arrived: not held
            self.hold_s = ema(self.hold_s, waited_s, COST_EMA_ALPHA)


@dataclass(frozen=True, slots=True)
class OverflowView:
    """One backend as the rule sees it (all in tokens and seconds)."""

    capacity: float  # the high watermark's limit
    reserved: int
    running: int  # of which held by programs with a call in the engine (must fit the GPU)
    batch: int  # sequences the engine is running (or the programs placed on it)
    host_tokens: int  # host (and disk) KV tier, 0: none
    max_overflow: float  # share of capacity that may be recomputed past it
    # Share of its cycle a program spends in a call (mean call time / (call + tool time)):
    # that share of what is admitted runs at once on average, and must fit the GPU.
    duty: float = 1.0
    # AdmissionParams.tier_reload: an overflow the host tier covers costs its reload only.
    tier_reload: bool = False
    # The whole contexts of the programs placed there (BackendView.contexts) and the host
    # tier in raw tokens: the tier covers what is admitted while those contexts, the new
    # one's too, fit the GPU and the tier together. Reservations cannot tell: an idle
    # program whose context fell to the tier reserves nothing, yet fills the tier.
    contexts: int = 0
    tier_tokens: int = 0


def allowance(costs: EngineCosts, view: OverflowView, footprint: int, budget_s: float) -> int:
    """Tokens past the limit the rule accepts for a program of `footprint` tokens whose
    `budget_s` is min(H, T): the host tier while reloading beats holding, plus `max_overflow`
    x capacity while recomputing does (0 until a per-token cost is known: hold, as before).
    The pause stage relieves a backend only above its limit plus this."""
    weight = max(1, footprint) * max(1, view.batch)
    if _tier_covers(costs, view, 0):
        assert costs.host_s_per_token is not None
        if weight * costs.host_s_per_token < budget_s:
            return view.host_tokens  # reloads, not recompute: no duty cap (tier_pays)
    tokens = 0.0
    if view.host_tokens > 0 and costs.host_s_per_token is not None:
        if weight * costs.host_s_per_token < budget_s:
            tokens += view.host_tokens
    if costs.prefill_s_per_token is not None and weight * costs.prefill_s_per_token < budget_s:
        tokens += view.max_overflow * view.capacity
    return int(min(tokens, _duty_room(view)))


def _duty_room(view: OverflowView) -> float:
    """Tokens past capacity whose running share (duty) still fits the GPU on average."""
    return view.capacity * (1.0 / max(view.duty, 1e-9) - 1.0)


def admit_past_capacity(
    costs: EngineCosts, view: OverflowView, footprint: int, budget_s: float
) -> bool:
    """The per-program rule, F * p_eff * B < min(H, T) = `budget_s` (module docstring)."""
    overflow = view.reserved + footprint - view.capacity
    if overflow <= 0:
        return True
    if _tier_covers(costs, view, footprint):
        return tier_pays(costs, view, footprint, budget_s)
    if view.running + footprint > view.capacity:
        # Running sequences' KV cannot spill: past this the engine preempts them, and a
        # preempted sequence recomputes its whole context (only idle programs' KV may go).
        return False
    if overflow > _duty_room(view):
        return False  # on average more would be running than the GPU holds
    host = view.host_tokens if costs.host_s_per_token is not None else 0
    if overflow <= host:
        assert costs.host_s_per_token is not None
        per_token = costs.host_s_per_token
    else:
        if costs.prefill_s_per_token is None:
            return False
        if overflow > host + view.max_overflow * view.capacity:
            return False
        per_token = costs.prefill_s_per_token
    return footprint * per_token * max(1, view.batch) < budget_s


def tier_has_room(contexts: int, gpu_tokens: float, tier_tokens: int, added: int = 0) -> bool:
    """Do the placed programs' whole contexts, with `added` more, fit the GPU cache and the
    host tier together? Past that, what falls to the tier pushes another context out of it:
    a recompute, not a reload (the one test admission and the idle-fate rule share)."""
    return contexts + added <= gpu_tokens + tier_tokens


def _tier_covers(costs: EngineCosts, view: OverflowView, added: int) -> bool:
    """tier_reload: the host tier is priced, and the placed programs' whole contexts, with
    `added` more, fit the GPU and the tier together (past that, what falls to the tier
    pushes another context out of it: a recompute, not a reload)."""
    return (
        view.tier_reload
        and costs.host_s_per_token is not None
        and 0 < view.host_tokens
        and 0 < view.tier_tokens
        and tier_has_room(view.contexts, view.capacity, view.tier_tokens, added)
    )


def tier_pays(costs: EngineCosts, view: OverflowView, footprint: int, budget_s: float) -> bool:
    """Admit past the GPU onto a host tier that covers the overflow (AdmissionParams
    `tier_reload`)? InferCept's min-waste rule for a program of context C on an engine running
    B sequences, with its KV's three fates: keep it on the GPU (C x expected tool time, cache
    token-seconds), swap it to the tier (C x r of reload, r = 1 / host load speed, stalling
    each of the B sequences' steps) or drop it (C x p, recompute). Where the tier has room,
    swapping is never worse than dropping (r < p) and costs no capacity, so the GPU need not
    hold what idle programs reserve, nor even every call in flight: a call the GPU has no
    room for waits in the engine's own queue with its KV on the tier, where it would wait in
    the gateway's queue had it been held, and the engine packs its batch by the blocks
    sequences really hold rather than by reservations. What admitting adds is one reload per
    cycle, F x r x B sequence-seconds, against the hold it spares the program, min(H, T) of
    one sequence: admit iff F x r x B < min(H, T) (the module's rule with p_eff = r, and no
    cap on what runs: the engine preempts to the tier, a reload, not a recompute)."""
    assert costs.host_s_per_token is not None
    return footprint * costs.host_s_per_token * max(1, view.batch) < budget_s


def duty(costs: EngineCosts, expected_tool_s: float) -> float:
    """Share of a program's cycle spent in a call (1.0, no overflow, until calls are timed)."""
    if costs.call_s is None:
        return 1.0
    cycle = costs.call_s + expected_tool_s
    return costs.call_s / cycle if cycle > 0 else 1.0


def budget(costs: EngineCosts, expected_tool_s: float) -> float:
    """min(H, T): the hold a program would wait, bounded by its cycle (tool + call)."""
    cycle = expected_tool_s + (costs.call_s or 0.0)
    return cycle if costs.hold_s is None else min(costs.hold_s, cycle)


def move_pays(
    context_tokens: int,
    wait_s: float,
    target_s_per_token: float,
    target_batch: int,
    reload_s_per_token: float,
    home_batch: int,
) -> bool:
    """Resume a paused program on another engine rather than wait for the one whose host
    tier holds its context? The same arithmetic as the rule above, in sequence-seconds:
    waiting costs the program `wait_s` (one sequence idle), then a reload of its context
    at home that stalls each step of home's batch (C x r x B_home); moving costs a full
    recompute of the context on the target, stalling each step of its batch (C x p x B).
    Move only if the wait and the reload exceed the recompute."""
    stay = wait_s + context_tokens * reload_s_per_token * max(1, home_batch)
    move = context_tokens * target_s_per_token * max(1, target_batch)
    return stay > move


def keeps_idle_context(
    remaining_s: float,
    batch_tokens: int,
    prefill_s_per_token: float,
    reload_s_per_token: float | None,
) -> bool:
    """Keep a program's KV resident while its tool runs, or let it go? InferCept's min-waste
    rule (scheduling-anchors.md), in cache token-seconds, for a context of C tokens:
    keeping it wastes C x the tool's expected remaining time; dropping it wastes its
    recompute, C x p seconds, times the KV of the batch that recompute stalls (M tokens: the
    running programs' reservations, as pausing passes it; InferCept also counts the
    recomputed context's own memory, C more, which measured mixed here: docs/scheduling.md);
    swapping it to a host tier wastes two transfers, 2 x C x r, times M.
    C divides out: keep iff remaining < min(p, 2r) x M. The batch's KV, not the engine's
    capacity, because what a stall wastes is the memory of the sequences it stalls."""
    per_token = prefill_s_per_token
    if reload_s_per_token is not None:
        per_token = min(per_token, 2.0 * reload_s_per_token)
    return remaining_s <= per_token * max(0, batch_tokens)
