"""A heap whose entries go stale instead of being removed, so updates stay O(log n)."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["LazyHeap", "T"]

T = TypeVar("T")
_COMPACT_EVERY = 4096


class LazyHeap(Generic[T]):
    """Min-heap of (key, item). An entry is live only while `is_live(item, stamp)` holds, where
    `stamp` is what the caller passed to `push`; stale entries are dropped when they surface,
    and the heap is compacted every few thousand pushes so churn cannot grow it unboundedly."""

    def __init__(self, is_live: Callable[[T, Any], bool]) -> None:
        self._heap: list[tuple[Any, int, T, Any]] = []
        self._seq = 0
        self._is_live = is_live

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, key: Any, item: T, stamp: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (key, self._seq, item, stamp))
        if self._seq % _COMPACT_EVERY == 0:
            self._compact()

    def compact_if_sparse(self, live_bound: int) -> None:
        """Drop stale entries once they are over half the heap (`live_bound` >= its live
        entries), so items that ended do not linger until thousands of pushes later. Each
        stale entry is dropped once, so this costs O(1) amortised per push."""
        if len(self._heap) > 2 * live_bound:
            self._compact()

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if self._is_live(e[2], e[3])]
        heapq.heapify(self._heap)

    def peek(self) -> tuple[Any, T] | None:
        heap = self._heap
        while heap and not self._is_live(heap[0][2], heap[0][3]):
            heapq.heappop(heap)
        if not heap:
            return None
        return heap[0][0], heap[0][2]

    def pop(self) -> tuple[Any, T] | None:
        top = self.peek()
        if top is not None:
            heapq.heappop(self._heap)
        return top
