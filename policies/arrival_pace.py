"""Whether new programs keep arriving: the pace of first requests, from their gaps.

A stream of programs (a service, an evaluation behind a client-side cap, the closed loop of
a rollout that starts a program when one ends) and the drain of a batch (every program
offered at once, or a stream that stopped) want different pause victims
(policies/stages.py, `victim: auto`): while new work keeps coming, finishing the programs
furthest along keeps completions flowing (shortest-remaining-first); once it stops, the
last program decides the makespan and every program should progress.

Only arrivals after some program has ended count: new work coming in while other work
finishes is a stream; the first requests of a batch, however spread out by its clients'
start-up (sandboxes starting, a ramp), are not. The pace is an exponential moving average
of the gaps between the counted arrivals. A stream is "on" while the time since the last
one is at most `patience` such gaps: a burst at one instant (a second batch) has gaps of
zero and is over at once; a stream whose arrivals stop is over after `patience` of its
usual gaps. Pure: the caller passes the time.

Whether the offering is over (`over`) is a stricter test, for a rule that only a true drain
repays (`new_first`, policies/stages.py): `streaming` turns off in every lull of a stream
longer than `patience` gaps (121 times in 520 s of `tool-orchestra-knee`'s long window),
while `over` holds only before any counted arrival (a batch being offered) or once the time
since the last one exceeds the longest gap between two counted arrivals so far: a stream
that has gone quiet for longer than it ever did.
"""

from __future__ import annotations

__all__ = ["ArrivalPace"]


class ArrivalPace:
    """EMA of the gaps between new programs' first requests, and whether they keep coming."""

    __slots__ = ("_ended", "_gap", "_last", "_max_gap", "patience", "weight")

    def __init__(self, patience: float = 4.0, weight: float = 0.1) -> None:
        if patience <= 0:
            raise ValueError("patience must be positive (a number of usual gaps)")
        if not 0 < weight <= 1:
            raise ValueError("weight must be in (0, 1]")
        self.patience = patience
        self.weight = weight
        self._gap: float | None = None  # None: fewer than two arrivals counted
        self._last: float | None = None
        self._max_gap: float | None = None  # the longest gap between counted arrivals
        self._ended = False  # some program has ended: arrivals from now on count

    @property
    def gap_s(self) -> float | None:
        """The usual gap between arrivals (None until two were seen)."""
        return self._gap

    def ended(self) -> None:
        """A program ended (released or expired)."""
        self._ended = True

    def arrived(self, now: float) -> None:
        """A new program's first request arrived at `now`."""
        if not self._ended:
            return
        if self._last is not None:
            gap = max(0.0, now - self._last)
            self._gap = gap if self._gap is None else self._gap + self.weight * (gap - self._gap)
            self._max_gap = gap if self._max_gap is None else max(self._max_gap, gap)
        self._last = now

    def streaming(self, now: float) -> bool:
        """New programs keep arriving: the last came within `patience` usual gaps."""
        if self._gap is None or self._last is None:
            return False
        return now - self._last <= self.patience * self._gap

    def over(self, now: float) -> bool:
        """No more new programs are to be expected: none has counted yet (a batch being
        offered), or the last came longer ago than the longest gap between two that did.
        After a single counted arrival, not over (a stream has begun, its pace unknown)."""
        if self._last is None:
            return True
        return self._max_gap is not None and now - self._last > self._max_gap
