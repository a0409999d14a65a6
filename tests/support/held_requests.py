"""Helpers for tests that need a program holding an engine's KV while others wait."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from support.polling import wait_until

BIG = {"model": "m", "messages": [{"role": "user", "content": "x " * 400}], "max_tokens": 8}
SMALL = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def start_hog(url: str, program_id: str = "hog") -> threading.Thread:
    """`program_id` streams a call needing nearly all of a 1,000-token engine; returns once
    the call is in flight (the thread ends with the stream)."""

    def run() -> None:
        body = {**BIG, "stream": True, "program_id": program_id, "max_tokens": 800}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
            for _ in r.iter_raw():
                pass

    thread = threading.Thread(target=run)
    thread.start()

    def started() -> bool:
        r = httpx.get(f"{url}/programs/{program_id}")
        return r.status_code == 200 and bool(r.json()["in_flight"])

    wait_until(started, 5, message=f"{program_id} to start")
    return thread


def wait_for(url: str, program_id: str, **fields: object) -> dict[str, Any]:
    """The program's view once every field has the given value (5 s at most)."""

    def reached() -> dict[str, Any] | None:
        r = httpx.get(f"{url}/programs/{program_id}")
        if r.status_code == 200 and all(r.json()[k] == v for k, v in fields.items()):
            view: dict[str, Any] = r.json()
            return view
        return None

    return wait_until(reached, 5, message=f"{program_id} to reach {fields}")
