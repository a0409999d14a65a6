"""The admission controller: how much KV each engine is let admit, set by measured goodput.

What it moves: one number per engine, the working-set limit `m`: the engine admits (and keeps
unpaused) programs while their reservations stay under `m` x its KV capacity. Tokens, not
programs: programs' contexts differ tenfold (a SWE agent's 60 k tokens beside an
orchestrator's 5 k), and KV is what they contend for; `m` scales whatever the reservations
count (the acting weight, the growth buffer), so those need no tuning of their own. At a
large `m` nothing is held: thunder-mw is then a cache-affinity router with bounded load;
near 1 it keeps the working set inside the cache.

What it measures: goodput `G`, the output tokens of the calls the gateway saw finish on the
engine, per second per call that wants it (policies/admission.py): the batch a hold narrows
and the recompute an overflow costs both show in it. (The engine's own generation counter,
smoother, was tried in the DES: rounds as noisy, so the noise is the workload's, not the
count's.)

How it moves (a probe cycle, as TCP BBR's and Envoy's gradient controller's): each round runs
four phases at `m*g` and `m/g` in the order up, down, down, up (the next round down, up, up,
down, so a drift in the workload cancels); each phase lasts two program cycles (call + tool
time: what a change of the limit takes to show, since an evicted context costs its recompute
only when its program returns from its tool) and only its second half is measured. Then
    if  G_up - G_down >  max(spread, eps x G):  m <- m*g   (goodput still rises)
    if  G_down - G_up >  max(spread, eps x G):  m <- m/g
    else                                        stay
where `spread` is the two phases' disagreement within an arm (the noise), and the step `g`
doubles (in log) on a second move the same way, halves on a reversal or a stay. A round counts
only where the lower probe's limit bound (someone waited, or the engine was full to it): a
limit nobody reaches says nothing. `m` stays within [floor, ceiling], the safety bounds.
Pure: every input arrives with `now`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Bounds", "OperatingPoint"]

# The order of one round's four phases (+1 the upper probe, -1 the lower); odd rounds reverse
# it, so a workload drifting linearly over a round favours neither arm.
_ROUND: tuple[int, ...] = (1, -1, -1, 1)


@dataclass(frozen=True, slots=True)
class Bounds:
    """The controller's safety bounds and step sizes (log steps: ln of the probe's ratio)."""

    floor: float = 0.9
    ceiling: float = 8.0
    # Where no limit binds the point comes down to what runs, but not below this: a light
    # load is no evidence that a lower limit pays once the load returns.
    idle_floor: float = 0.0
    step: float = math.log(1.05)
    min_step: float = math.log(1.05)
    max_step: float = math.log(2.0)
    # A move needs the rounds' mean gain `z` standard errors off zero and above `min_gain`;
    # after `max_rounds` without, the point stays (and the step halves).
    min_gain: float = 0.01
    z: float = 2.0
    max_rounds: int = 6
    # Each phase, in program cycles, and the share of it not measured (the transient).
    cycles_per_phase: float = 2.0
    warmup_phases: int = 2  # phases at the starting point before the first probe
    settle: float = 0.5
    # Below this a phase holds too few calls (and too few scrapes) to measure anything.
    min_phase_s: float = 10.0
    max_phase_s: float = 600.0


@dataclass(slots=True)
class _Phase:
    arm: int
    start: float
    length_s: float
    tokens_at_measure: float | None = None  # the counter when measuring began
    measure_start: float | None = None
    last_tick: float | None = None
    demand_s: float = 0.0  # calls wanting the engine, integrated over the measured time
    bound: bool = False  # the limit was reached while measuring


@dataclass(slots=True)
class OperatingPoint:
    """One engine's working-set limit and the probe round that moves it."""

    point: float
    bounds: Bounds = field(default_factory=Bounds)
    step: float = 0.0
    rounds: int = 0  # rounds completed (decided or not)
    decided: int = 0  # of which measured with the limit binding
    moves: int = 0
    last_move: int = 0  # +1 up, -1 down, 0 stayed
    _phase: _Phase | None = None
    _index: int = 0
    _rates: list[tuple[int, float]] = field(default_factory=list)
    _diffs: list[float] = field(default_factory=list)
    _bound_low: bool = False
    _peak_use: float = 0.0
    _warming: int = 0

    def __post_init__(self) -> None:
        self.point = self._clamp(self.point)
        if self.step == 0.0:
            self.step = self.bounds.step

    # -- what the limit is now
    def factor(self) -> float:
        """The limit in force now, as a multiple of capacity (the probe's, mid-round)."""
        if self._phase is None:
            return self.point
        return self._probe(self._phase.arm)

    def _probe(self, arm: int) -> float:
        return self._clamp(self.point * math.exp(arm * self.step))

    def _clamp(self, m: float) -> float:
        return min(self.bounds.ceiling, max(self.bounds.floor, m))

    # -- feedback
    def tick(
        self,
        now: float,
        tokens_total: float,
        demand: float,
        use: float,
        bound: bool,
        cycle_s: float,
    ) -> float:
        """Advances the probe round: `tokens_total` is the engine's cumulative output tokens,
        `demand` the calls that want it now (running, queued in it, or held for it), `use`
        the reservations on it as a multiple of capacity, `bound` whether its limit binds now
        (a program waits, or reservations reach it), `cycle_s` a program's call + tool time.
        Returns the limit factor to apply."""
        self._peak_use = max(self._peak_use, use)
        phase = self._phase
        if phase is None:
            self._start_phase(now, cycle_s)
            return self.factor()
        if phase.measure_start is None:
            if now >= phase.start + phase.length_s * self.bounds.settle:
                phase.measure_start, phase.tokens_at_measure = now, tokens_total
                phase.last_tick = now
        else:
            assert phase.last_tick is not None
            phase.demand_s += max(0.0, demand) * (now - phase.last_tick)
            phase.last_tick = now
            phase.bound = phase.bound or bound
        if now < phase.start + phase.length_s:
            return self.factor()
        self._end_phase(now, tokens_total)
        self._start_phase(now, cycle_s)
        return self.factor()

    def _start_phase(self, now: float, cycle_s: float) -> None:
        b = self.bounds
        length = min(b.max_phase_s, max(b.min_phase_s, b.cycles_per_phase * cycle_s))
        if self._warming < b.warmup_phases:
            # First cruise at the prior: a run shorter than a round is better served by it
            # than by a probe that has no time to be judged (and costs what it probes).
            self._warming += 1
            self._phase = _Phase(arm=0, start=now, length_s=length)
            return
        arm = _ROUND[self._index] * (1 if self.rounds % 2 == 0 else -1)
        self._phase = _Phase(arm=arm, start=now, length_s=length)

    def _end_phase(self, now: float, tokens_total: float) -> None:
        phase = self._phase
        assert phase is not None
        if phase.arm == 0:
            return  # a warm-up phase: nothing measured
        if phase.tokens_at_measure is not None and phase.demand_s > 0:
            # Output tokens per second per call wanting the engine: the speed a call sees,
            # held time included. With the programs and their tools given, a closed loop's
            # throughput is highest where that is; and it does not move with how many
            # programs happen to be in their tools, which the raw rate does, tenfold more.
            rate = max(0.0, tokens_total - phase.tokens_at_measure) / phase.demand_s
            self._rates.append((phase.arm, rate))
            if phase.arm < 0 and phase.bound:
                self._bound_low = True
        self._index += 1
        if self._index == len(_ROUND):
            if self._bound_low:
                self._decide()
            else:
                # Nobody reached the lower probe: the point is far above the working set,
                # and a probe there says nothing. Bring it down to just above what runs, so
                # the next round probes where a limit would bind (a point at the ceiling
                # after a cheap phase would otherwise never notice recompute turning dear).
                top = max(self.bounds.idle_floor, self._peak_use * math.exp(self.step))
                self.point = self._clamp(min(self.point, top))
                self._diffs.clear()
            self._index = 0
            self._rates.clear()
            self._bound_low = False
            self._peak_use = 0.0
            self.rounds += 1

    def _decide(self) -> None:
        up = [r for arm, r in self._rates if arm > 0]
        down = [r for arm, r in self._rates if arm < 0]
        if len(up) != 2 or len(down) != 2:
            return  # a phase unmeasured: nothing learned
        g_up, g_down = sum(up) / 2, sum(down) / 2
        mean = (g_up + g_down) / 2
        if mean <= 0:
            return
        # The evidence at this point, round by round: a move needs the rounds' mean relative
        # gain to stand `z` standard errors off zero (and above `min_gain`): one round of an
        # agent workload is far too noisy to decide on.
        diffs = self._diffs
        diffs.append((g_up - g_down) / mean)
        n = len(diffs)
        if n < 2:
            return
        avg = sum(diffs) / n
        sd = math.sqrt(sum((d - avg) ** 2 for d in diffs) / (n - 1))
        b = self.bounds
        if abs(avg) > max(b.z * sd / math.sqrt(n), b.min_gain):
            direction = 1 if avg > 0 else -1
            moved = self._probe(direction)
            if moved == self.point:
                # Pinned at a bound: a move that cannot happen is a stay, so the step
                # shrinks instead of doubling on each "repeated" move (a point at the floor
                # would otherwise probe ever further above it, at up to twice the floor).
                direction = 0
            self.point = moved
        elif n >= b.max_rounds:
            direction = 0
        else:
            return
        diffs.clear()
        self._moved(direction)

    def _moved(self, direction: int) -> None:
        b = self.bounds
        if direction and direction == self.last_move:
            self.step = min(b.max_step, self.step * 2)
        elif not direction or (self.last_move and direction != self.last_move):
            self.step = max(b.min_step, self.step / 2)
        self.decided += 1
        if direction:
            self.moves += 1
        self.last_move = direction
