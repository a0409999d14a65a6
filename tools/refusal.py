"""The one error the tool manager answers a request with: containers it may not hand over."""

from __future__ import annotations

__all__ = ["ToolRefused"]


class ToolRefused(Exception):
    """A request names containers its program may not own: answered with this error."""

    def __init__(self, status: int, message: str, param: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
