"""Replays what the recording backend received to a real engine, to prove the engine accepts it.

The recording backend shows what a server forwards; this answers the next question, "would
vLLM (or SGLang) take that body?". Each replayed body keeps every field as forwarded except
`model` (the engine's own) and the token limit (capped, so the replay stays cheap).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

from thunder_mw.conformance.recording_backend import Recorded
from thunder_mw.conformance.runner import CheckResult

__all__ = [
    "MAX_REPLAY_BODY_BYTES",
    "Replayed",
    "as_checks",
    "engine_model",
    "origin_check",
    "prepared",
    "replay",
    "replayable",
]

_TAG = re.compile(r"\[conformance (\S+) #\d+ [0-9a-f]+\]")
MAX_REPLAY_BODY_BYTES = 16 * 1024


@dataclass
class Replayed:
    check_id: str
    path: str
    status: int | None  # None: not sent (see detail)
    detail: str

    @property
    def accepted(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def origin_check(record: Recorded) -> str | None:
    match = _TAG.search(record.body.decode("utf-8", "replace"))
    return match.group(1) if match else None


def replayable(
    records: list[Recorded], check_ids: set[str] | None = None, per_check: int = 1
) -> list[Recorded]:
    """Forwarded inference bodies, at most `per_check` per originating check."""
    chosen: list[Recorded] = []
    taken: dict[str, int] = {}
    for record in records:
        origin = origin_check(record)
        if origin is None or record.method != "POST" or record.path.endswith("/responses"):
            continue
        if check_ids is not None and origin not in check_ids:
            continue
        if taken.get(origin, 0) >= per_check:
            continue
        taken[origin] = taken.get(origin, 0) + 1
        chosen.append(record)
    return chosen


def prepared(body: dict[str, Any], model: str, max_tokens: int) -> dict[str, Any]:
    """The forwarded body, with the engine's model and a capped token limit, order kept."""
    out = dict(body)
    out["model"] = model
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(out.get(key), int):
            out[key] = min(out[key], max_tokens)
    if "max_tokens" not in out and "max_completion_tokens" not in out:
        out["max_tokens"] = max_tokens
    return out


async def engine_model(client: httpx.AsyncClient, engine_url: str) -> str:
    response = await client.get(engine_url.rstrip("/") + "/v1/models")
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


async def replay(
    records: list[Recorded],
    engine_url: str,
    *,
    model: str | None = None,
    max_tokens: int = 4,
    max_body_bytes: int = MAX_REPLAY_BODY_BYTES,
) -> list[Replayed]:
    results = []
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        model = model or await engine_model(client, engine_url)
        for record in records:
            origin = origin_check(record) or f"request#{record.seq}"
            body = record.json()
            if not isinstance(body, dict):
                results.append(Replayed(origin, record.path, None, "not a JSON object"))
                continue
            if len(record.body) > max_body_bytes:
                results.append(
                    Replayed(
                        origin,
                        record.path,
                        None,
                        f"{len(record.body)} bytes: longer than the replay limit",
                    )
                )
                continue
            payload = json.dumps(prepared(body, model, max_tokens), ensure_ascii=False).encode()
            response = await client.post(
                engine_url.rstrip("/") + record.path,
                content=payload,
                headers={"content-type": "application/json"},
            )
            text = response.text
            results.append(Replayed(origin, record.path, response.status_code, text[:300]))
    return results


def as_checks(results: list[Replayed], engine_url: str) -> list[CheckResult]:
    """Replay outcomes as report entries (`engine.accepts:<check id>`)."""
    out = []
    for r in results:
        statement = (
            f"The body forwarded for {r.check_id} is accepted by the engine at {engine_url}."
        )
        if r.status is None:
            out.append(CheckResult(f"engine.accepts:{r.check_id}", statement, "n/a", r.detail))
        elif r.accepted:
            out.append(CheckResult(f"engine.accepts:{r.check_id}", statement, "pass", ""))
        else:
            detail = f"the engine answered {r.status}: {r.detail}"
            out.append(CheckResult(f"engine.accepts:{r.check_id}", statement, "fail", detail))
    return out
