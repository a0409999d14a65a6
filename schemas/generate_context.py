"""Program identity on SGLang's native `POST /generate`: the `rid` prefix convention.

Rollout frameworks that speak SGLang's own API name requests with `rid` (SGLang's request id,
unique per request). When a `/generate` body names no program by any other convention
(`program_id` in the body, the headers), a `rid` of the form `<program_id>::<anything>` names
it: the text before the first `::`. The `rid` itself is left in the body: the engine needs it
(it aborts requests by rid). A batch's `rid` list must name one program.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RID_SEPARATOR", "RidError", "program_from_rid"]

RID_SEPARATOR = "::"


class RidError(ValueError):
    """The `rid` names programs inconsistently: `param` says where."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def program_from_rid(body: dict[str, Any]) -> tuple[str, str] | None:
    """(program id, param) named by `body["rid"]`, or None when it follows no convention."""
    rid = body.get("rid")
    if isinstance(rid, str):
        return _prefix(rid, "rid")
    if not isinstance(rid, list) or not rid:
        return None
    named = [_prefix(r, f"rid[{i}]") if isinstance(r, str) else None for i, r in enumerate(rid)]
    first = named[0]
    for found in named[1:]:
        if (found and found[0]) != (first and first[0]):
            param = found[1] if found else f"rid[{named.index(found)}]"
            raise RidError("the rids of one /generate batch must name one program", param)
    return first


def _prefix(rid: str, param: str) -> tuple[str, str] | None:
    program, sep, rest = rid.partition(RID_SEPARATOR)
    if not sep or not program or not rest:
        return None
    return program, param
