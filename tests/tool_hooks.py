"""A custom reclaim hook (`tool_hooks:record`) for the tool-manager tests."""

from __future__ import annotations

CALLS: list[tuple[str, str, str]] = []


def record(container, program_id: str, reason: str) -> None:
    CALLS.append((container.id, program_id, reason))
