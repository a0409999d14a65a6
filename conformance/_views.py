"""Reads the live programs of a server under test, in the shapes agent-context servers publish.

thunder-mw answers `GET /programs` with `{"programs": [{"program_id", "steps", ...}]}`; other
servers answer with a bare list, a map keyed by program id, items keyed `id`, step counts
named `step_count` or `num_steps`, or (the vLLM router) no `/programs` at all but a
`GET /scheduling/diagnostics` whose ranks list their programs with the client's id in
`root_program_id`. A check that needs program views gets them from here, or None when the
server shows none — then it reports n/a instead of passing on nothing.
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["PARENT_KEYS", "STEP_KEYS", "Views", "parent_of", "read_program_views", "steps_of"]

Views = dict[str, dict[str, Any]]

# Keys that name a program in an item of a list, in the order they are tried.
_ID_KEYS = ("program_id", "id", "session_id", "root_program_id")
# Keys that count a program's requests (steps), in the order they are tried.
STEP_KEYS = ("steps", "step_count", "num_steps", "steps_completed", "request_count")
# Keys that name a program's parent.
PARENT_KEYS = ("parent_program_id", "parent_id", "parent", "parent_session_id")


async def read_program_views(client: httpx.AsyncClient, target: str) -> Views | None:
    """Live programs by id, or None when the server has no route publishing them."""
    views = _from_programs(await _get_json(client, target + "/programs"))
    if views is not None:
        return views
    return _from_diagnostics(await _get_json(client, target + "/scheduling/diagnostics"))


def steps_of(view: dict[str, Any]) -> int | None:
    """The program's step (request) count under any of the names servers use, else None."""
    for key in STEP_KEYS:
        value = view.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def parent_of(view: dict[str, Any]) -> tuple[bool, str | None]:
    """(whether the view has a parent field at all, its value)."""
    for key in PARENT_KEYS:
        if key in view:
            value = view[key]
            return True, value if isinstance(value, str) else None
    return False, None


async def _get_json(client: httpx.AsyncClient, url: str) -> Any:
    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _from_programs(data: Any) -> Views | None:
    if isinstance(data, dict) and "programs" in data:
        data = data["programs"]
    if isinstance(data, list):
        return _from_items(data)
    if isinstance(data, dict):
        return {str(k): v if isinstance(v, dict) else {"value": v} for k, v in data.items()}
    return None


def _from_items(items: list[Any]) -> Views:
    views: Views = {}
    for item in items:
        if not isinstance(item, dict):
            continue
        key = next((item[k] for k in _ID_KEYS if isinstance(item.get(k), str)), None)
        if key is not None:
            views[key] = item
    return views


def _from_diagnostics(data: Any) -> Views | None:
    """The vLLM router's `/scheduling/diagnostics`: `ranks[].programs[]`, whose `program` is a
    hash and whose `root_program_id` is the id the client sent (for a root program)."""
    if not isinstance(data, dict) or not isinstance(data.get("ranks"), list):
        return None
    views: Views = {}
    for rank in data["ranks"]:
        programs = rank.get("programs") if isinstance(rank, dict) else None
        for item in programs if isinstance(programs, list) else ():
            if not isinstance(item, dict):
                continue
            key = item.get("program_id") or item.get("root_program_id")
            if isinstance(key, str):
                views[key] = item
    return views
