"""Which containers the gateway may manage, and what reclaiming one means: pure decisions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["BUILTIN_HOOKS", "Selector", "reclaim_steps", "retry_delay_s"]

BUILTIN_HOOKS = ("stop", "remove", "remove_image")


class Selector:
    """A container is manageable only if it carries the label (and, if set, the name prefix):
    a client naming any other container, a database say, must not get it deleted."""

    def __init__(self, label: str | None, name_prefix: str | None) -> None:
        if label is None and not name_prefix:
            raise ValueError("a selector needs a label or a name prefix")
        key, _, value = (label or "").partition("=")
        self.label_key: str | None = key or None
        self.label_value = value
        self.name_prefix = name_prefix or None

    def matches(self, labels: Mapping[str, str] | None, name: str) -> bool:
        if self.label_key is not None and (labels or {}).get(self.label_key) != self.label_value:
            return False
        return self.name_prefix is None or name.lstrip("/").startswith(self.name_prefix)

    def describe(self) -> str:
        parts = []
        if self.label_key is not None:
            parts.append(f"label {self.label_key}={self.label_value}")
        if self.name_prefix is not None:
            parts.append(f"a name starting with {self.name_prefix!r}")
        return " and ".join(parts)

    def labels(self) -> dict[str, str]:
        """Labels a container the gateway starts must carry so that it may manage it."""
        return {self.label_key: self.label_value} if self.label_key is not None else {}


def reclaim_steps(hooks: Sequence[str], remove_images: bool) -> tuple[list[str], bool]:
    """The per-container steps in order, and whether the image goes once nothing uses it.

    Image removal always comes last whatever its position in the list: an image cannot go
    while its container exists."""
    steps = [h for h in hooks if h != "remove_image"]
    return steps, remove_images or "remove_image" in hooks


def retry_delay_s(attempts: int, max_interval_s: float) -> float:
    """Exponential backoff for a failing reclaim: 0.5 s, 1 s, 2 s ... up to the cap."""
    return min(max_interval_s, 0.5 * 2.0 ** max(0, attempts - 1))
