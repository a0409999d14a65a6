"""Shared prefixes are held once: the credit a backend's reservations get for them.

Every program's footprint counts its whole context, the system prompt it shares with the
other programs of its kind included. An engine with prefix caching (vLLM's automatic prefix
caching, SGLang's radix cache) holds those shared blocks once, reference-counted, and its
KV gauge counts them once: with `n` programs of one kind on an engine, the reservations
count `n - 1` copies of their prefix that take no memory (OpenHands' ~6 k-token system
prompt x 14 programs: ~11 % of an 8xH100 GLM-4.6 engine's cache).

Per backend and prefix key, this counts the ACTIVE programs whose reservation includes the
prefix, at the weight their reservation counts it (1 while a call is in flight, the pause
stage's `acting_token_weight` while a tool runs: their KV is then evictable cache), and
credits all but the heaviest copy: `credit = size * (n_run + w * n_act - max weight)`.
`running_credit` is its share over programs with a call in flight (`size * (n_run - 1)`),
what the engine holds for running requests alone. Pure arithmetic: O(1) per change.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SharedPrefixes"]


@dataclass(slots=True)
class _Prefix:
    size: int  # tokens, as estimated when its first holder came
    running: int = 0  # holders with a call in flight
    acting: int = 0  # holders in a tool call
    credit: int = 0  # what this prefix credits now
    running_credit: int = 0  # of which among holders with a call in flight


class SharedPrefixes:
    """One backend's prefixes held by its ACTIVE programs, and the tokens counted twice."""

    __slots__ = ("_acting_weight", "_prefixes", "credit", "running_credit")

    def __init__(self, acting_weight: float) -> None:
        if not 0 <= acting_weight <= 1:
            raise ValueError("acting_weight must be within [0, 1]")
        self._acting_weight = acting_weight
        self._prefixes: dict[str, _Prefix] = {}
        self.credit = 0  # reserved tokens that are copies of a prefix held once
        self.running_credit = 0  # of which among programs with a call in flight

    def add(self, key: str, size: int, running: bool) -> None:
        """A program holding `key` (`size` tokens) became ACTIVE here, or changed phase."""
        prefix = self._prefixes.get(key)
        if prefix is None:
            prefix = self._prefixes[key] = _Prefix(max(0, size))
        if running:
            prefix.running += 1
        else:
            prefix.acting += 1
        self._update(prefix)

    def remove(self, key: str, running: bool) -> None:
        """The reverse of one `add` (paused, released, moved, or changed phase)."""
        prefix = self._prefixes.get(key)
        if prefix is None:
            raise KeyError(f"prefix {key!r} has no holder here")
        if running:
            prefix.running -= 1
        else:
            prefix.acting -= 1
        if prefix.running < 0 or prefix.acting < 0:
            raise ValueError(f"prefix {key!r} removed more often than added")
        self._update(prefix)
        if prefix.running == 0 and prefix.acting == 0:
            del self._prefixes[key]

    def credit_for(self, key: str | None, running: bool) -> int:
        """Tokens one more holder of `key` here would reserve that are already held."""
        prefix = self._prefixes.get(key) if key is not None else None
        if prefix is None:
            return 0
        if running and not prefix.running:
            # It becomes the full copy; the idle copies already counted are credited now.
            return int(self._acting_weight * prefix.size)
        return prefix.size if running else int(self._acting_weight * prefix.size)

    def _update(self, prefix: _Prefix) -> None:
        w = self._acting_weight
        size = prefix.size
        if prefix.running:
            running_credit = size * (prefix.running - 1)
            credit = running_credit + int(w * size * prefix.acting)
        else:
            running_credit = 0
            credit = int(w * size * max(0, prefix.acting - 1))
        self.credit += credit - prefix.credit
        self.running_credit += running_credit - prefix.running_credit
        prefix.credit = credit
        prefix.running_credit = running_credit
