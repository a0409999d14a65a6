"""An approximate index of which prefixes each engine still caches, from what was routed where.

Shared by the `kv_aware` baseline (per-program contexts) and thunder-mw's `kv_placement`
stage (shared prefixes: a session type's system prompt). It is the approximation SGLang's
cache-aware router and Dynamo's KvRouter make without engine events: an engine caches what
was last sent to it, and forgets the least recently used prefixes once they outgrow its KV
capacity (the engine would have evicted them). Pure and O(1) amortised per update.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

__all__ = ["PrefixIndex"]


class PrefixIndex:
    """Per engine, an LRU map from a prefix key to the tokens of it the engine is believed to
    hold, bounded by `fraction` x the engine's capacity (`capacity_of(label)`; None: no bound)."""

    def __init__(self, capacity_of: Callable[[str], int | None], fraction: float = 1.0) -> None:
        self._capacity_of = capacity_of
        self._fraction = fraction
        self._cached: dict[str, collections.OrderedDict[str, int]] = {}
        self._sum: dict[str, int] = {}

    def overlap(self, backend: str, key: str) -> int:
        """Tokens of `key` the index believes `backend` still caches (0: none)."""
        cached = self._cached.get(backend)
        return cached.get(key, 0) if cached is not None else 0

    def holds(self, key: str) -> list[str]:
        """The engines believed to cache `key` (O(engines))."""
        return [label for label, cached in self._cached.items() if key in cached]

    def remember(self, backend: str, key: str, tokens: int) -> None:
        """`backend` was just sent `tokens` of `key`: it is the most recently used there."""
        cached = self._cached.setdefault(backend, collections.OrderedDict())
        total = self._sum.get(backend, 0) - cached.pop(key, 0) + tokens
        cached[key] = tokens
        capacity = self._capacity_of(backend)
        if capacity is not None:
            limit = capacity * self._fraction
            while total > limit and len(cached) > 1:
                _, evicted = cached.popitem(last=False)
                total -= evicted
        self._sum[backend] = total

    def forget(self, key: str) -> None:
        """`key` is gone (its program ended): no engine is credited with it any more."""
        for backend, cached in self._cached.items():
            if key in cached:
                self._sum[backend] -= cached.pop(key)

    def forget_backend(self, backend: str) -> None:
        """The engine's cache was flushed (or it left): it holds nothing we know of."""
        self._cached.pop(backend, None)
        self._sum.pop(backend, None)

    def tokens_held(self, backend: str) -> int:
        return self._sum.get(backend, 0)
