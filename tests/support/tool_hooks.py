"""A custom reclaim hook (`support.tool_hooks:record`) for the tool-manager tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from docker.models.containers import Container

CALLS: list[tuple[str | None, str, str]] = []


def record(container: Container, program_id: str, reason: str) -> None:
    CALLS.append((container.id, program_id, reason))
