"""The admitted working set of one engine, set by feedback on its measured goodput.

Fixed watermarks are right in one regime and wrong in the next: where recompute is dear the
best working set is about what the KV cache holds; where it is cheap holding anything only
narrows the batch. Rather than predict the operating point from a cost model, the controller
measures it, as TCP BBR and Netflix's concurrency-limits do for a network path: it moves the
engine's admission limit L (reserved tokens as a multiple of the KV capacity) a step at a
time, keeps moving while goodput (output tokens per second the engine's answers carried)
rises, turns around when it falls, and so keeps probing around the best point — which also
lets it follow the workload, the fleet or the engine when they change.

- An epoch lasts until the engine has answered `min_calls` calls (and `min_epoch_s` has
  passed): goodput is averaged over enough calls that one long answer does not steer it.
- Only epochs in which the limit bound count (programs waited in the queue for most of it):
  below the limit, throughput follows the offered load, not the limit.
- A turn halves the step (down to `min_step`), a run of moves in one direction doubles it
  (up to `max_step`): it settles near the optimum and moves fast after a shift.
- Within the dead band (`tolerance`) it prefers to hold less: a wider batch costs no
  goodput there and waiting programs gain latency.

L stays within [`min_limit`, `max_limit`], the safety bounds; at `max_limit` the engine is
effectively never held back (a cache-affinity router with a bounded load). Pure: the clock
is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ControllerBounds:
    initial: float = 1.0
    min_limit: float = 0.5
    max_limit: float = 3.0
    min_step: float = 0.05
    max_step: float = 0.4
    tolerance: float = 0.03
    min_calls: int = 32
    min_epoch_s: float = 5.0
    binding_share: float = 0.5


class GoodputController:
    """One engine's admission limit; feed it answers and ticks."""

    __slots__ = (
        "_binding_s",
        "_calls",
        "_last_tick",
        "_moves",
        "_started",
        "_tokens",
        "bounds",
        "direction",
        "epochs",
        "last_rate",
        "limit",
        "step",
    )

    def __init__(self, now: float, bounds: ControllerBounds | None = None) -> None:
        self.bounds = bounds or ControllerBounds()
        self.limit = self.bounds.initial
        self.step = 0.1
        self.direction = 1
        self.last_rate: float | None = None
        self.epochs = 0  # epochs that moved the limit (for tests and the decision log)
        self._moves = 0  # moves in a row in `direction`
        self._restart(now)

    def _restart(self, now: float) -> None:
        self._started = self._last_tick = now
        self._tokens = 0
        self._calls = 0
        self._binding_s = 0.0

    def observe(self, output_tokens: int) -> None:
        """One answered call on this engine."""
        self._tokens += output_tokens
        self._calls += 1

    def tick(self, now: float, binding: bool) -> bool:
        """`binding`: programs are waiting for room now. Returns True when the limit moved."""
        if binding:
            self._binding_s += now - self._last_tick
        self._last_tick = now
        elapsed = now - self._started
        b = self.bounds
        if self._calls < b.min_calls or elapsed < b.min_epoch_s:
            return False
        rate = self._tokens / elapsed
        bound = self._binding_s >= b.binding_share * elapsed
        self._restart(now)
        if not bound:
            # Demand was below the limit: this epoch says nothing about where the limit
            # should be; the next bound epoch starts a fresh comparison.
            self.last_rate = None
            return False
        previous, self.last_rate = self.last_rate, rate
        if previous is not None:
            if rate < previous * (1 - b.tolerance):
                self._turn(-self.direction)
            elif rate <= previous * (1 + b.tolerance) and self.direction < 0:
                self._turn(1)  # no better for holding more: hold less
            else:
                self._moves += 1
                if self._moves >= 2:
                    self.step = min(b.max_step, self.step * 2)
        moved = min(b.max_limit, max(b.min_limit, self.limit + self.direction * self.step))
        if moved == self.limit:
            # At a bound: probe back from it next time.
            self._turn(-self.direction)
            return False
        self.limit = moved
        self.epochs += 1
        return True

    def _turn(self, direction: int) -> None:
        self.direction = direction
        self._moves = 0
        self.step = max(self.bounds.min_step, self.step / 2)
