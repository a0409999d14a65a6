"""The simulated engine's RL-rollout routes: SGLang's native `/generate`, and the pause, weight
update and sleep routes of SGLang and vLLM, so a gateway's rollout cycle can be tested on it.

`/generate` answers as SGLang does: `{"text", "output_ids", "meta_info": {"id",
"prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason", ...}}` (a list for a
batch), and streams `data: {...}` events whose `text` and `output_ids` are cumulative, ending
with `data: [DONE]`. A weight update flushes the prefix cache (every cached block was computed
with the old weights) and bumps `weight_version`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from thunder_mw.sim.engine import SamplingParams, Sequence

__all__ = ["EngineControl", "native_routes"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class EngineControl:
    """Pause, sleep and weight version of one simulated engine (the step loop honours
    `svc.resumed`: while it is clear, no step runs and running requests stay where they are)."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        self.sleeping = False
        self.weight_version = "default"
        self.flushes = 0

    @property
    def paused(self) -> bool:
        return not self.svc.resumed.is_set()

    def pause(self) -> None:
        self.svc.resumed.clear()

    def resume(self) -> None:
        self.svc.resumed.set()
        self.svc._wake.set()

    def abort_all(self) -> int:
        engine = self.svc.engine
        aborted = sum(1 for rid in list(engine._by_id) if engine.abort(rid))
        self.svc._wake.set()
        return aborted

    async def until_idle(self) -> None:
        while self.svc.engine.has_work:  # noqa: ASYNC110 (the engine signals no idle event)
            await asyncio.sleep(0.01)

    async def flush(self) -> bool:
        """Flush the prefix cache once no request holds blocks (at once when idle)."""
        if self.svc.engine.has_work and self.paused:
            return False  # requests kept in place hold blocks: flushed when they are done
        await self.until_idle()
        self.flushes += 1
        return bool(self.svc.engine.reset_prefix_cache())


def _error(status: int, message: str, param: str | None = None) -> Response:
    body = {
        "error": {"message": message, "type": "BadRequestError", "param": param, "code": status}
    }
    return Response(_encode(body), status, media_type="application/json")


def _count(value: Any) -> bool:
    """A token count: a non-negative int (a bool is not one, nor is 1.5, which never ends)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _json(data: Any, status: int = 200) -> Response:
    return Response(_encode(data), status, media_type="application/json")


async def _object(request: Request, optional: bool = True) -> dict[str, Any] | Response:
    raw = await request.body()
    if optional and not raw.strip():
        return {}
    try:
        body = _decode(raw)
    except msgspec.DecodeError as exc:
        return _error(400, f"Invalid JSON: {exc}")
    except RecursionError:  # nested past the decoder's depth
        return _error(400, "Invalid JSON: nested too deeply")
    if not isinstance(body, dict):
        return _error(400, "The request body must be a JSON object")
    return body


def native_routes(svc: Any) -> list[Route]:
    """The routes of this module for the engine's flavour (`svc` is the SimService)."""
    control = EngineControl(svc)
    svc.control = control
    if svc.flavor == "sglang":
        sglang = _SglangRoutes(svc, control)
        return [
            Route("/generate", sglang.generate, methods=["POST"]),
            Route("/pause_generation", sglang.pause_generation, methods=["POST"]),
            Route("/continue_generation", sglang.continue_generation, methods=["POST"]),
            Route("/update_weights_from_disk", sglang.update_weights_from_disk, methods=["POST"]),
            Route("/release_memory_occupation", sglang.release_memory, methods=["POST"]),
            Route("/resume_memory_occupation", sglang.resume_memory, methods=["POST"]),
        ]
    vllm = _VllmRoutes(control)
    return [
        Route("/pause", vllm.pause, methods=["POST"]),
        Route("/resume", vllm.resume, methods=["POST"]),
        Route("/is_paused", vllm.is_paused, methods=["GET"]),
        Route("/sleep", vllm.sleep, methods=["POST"]),
        Route("/wake_up", vllm.wake_up, methods=["POST"]),
        Route("/is_sleeping", vllm.is_sleeping, methods=["GET"]),
    ]


def _token_lists(value: Any) -> bool:
    """A non-empty list of non-empty lists of token ids (a batch of `input_ids`)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in value)
    )


def _sampling_params(body: dict[str, Any]) -> tuple[SamplingParams, bool] | Response:
    """`/generate`'s sampling params and stream flag, or the 400 naming the bad field."""
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, dict):
        return _error(400, "sampling_params must be an object", "sampling_params")
    max_new = sampling.get("max_new_tokens", 128)
    if not _count(max_new):
        return _error(400, "max_new_tokens must be a non-negative integer", "max_new_tokens")
    min_new = sampling.get("min_new_tokens", 0)
    if not _count(min_new):
        return _error(400, "min_new_tokens must be a non-negative integer", "min_new_tokens")
    ignore_eos = sampling.get("ignore_eos", False)
    stream = body.get("stream", False)
    for name, flag in (("ignore_eos", ignore_eos), ("stream", stream)):
        if not isinstance(flag, bool):
            return _error(400, f"{name} must be a boolean", name)
    return SamplingParams(max_tokens=max_new, min_tokens=min_new, ignore_eos=ignore_eos), stream


def _finish_reason(seq: Sequence) -> dict[str, Any] | None:
    """SGLang's `meta_info.finish_reason` (None while the request runs)."""
    if seq.finish_reason is None:
        return None
    if seq.finish_reason == "length":
        return {"type": "length", "length": seq.num_output}
    if seq.finish_reason == "abort":
        return {"type": "abort", "message": "Abort before prefill"}
    return {"type": "stop", "matched": None}


class _SglangRoutes:
    """SGLang's native `/generate` and its pause, weight-update and memory routes."""

    def __init__(self, svc: Any, control: EngineControl) -> None:
        self.svc = svc
        self.control = control
        self.engine = svc.engine
        self.tokenizer = svc.tokenizer

    # ------------------------------------------------------------------ /generate
    def answer(self, seq: Sequence, rid: str) -> dict[str, Any]:
        ids = self.engine.output_ids(seq)
        meta = {
            "id": rid,
            "finish_reason": _finish_reason(seq),
            "prompt_tokens": seq.prompt_len,
            "completion_tokens": seq.num_output,
            "cached_tokens": max(seq.num_cached_tokens, 0),
            "weight_version": self.control.weight_version,
            "e2e_latency": 0.0,
        }
        return {"text": self.tokenizer.decode(ids), "output_ids": ids, "meta_info": meta}

    def _prompts(self, body: dict[str, Any]) -> list[list[int]] | Response:
        ids, text = body.get("input_ids"), body.get("text")
        if (ids is None) == (text is None):
            return _error(400, "Either text or input_ids should be provided.", "text")
        if ids is not None:
            if isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids):
                return [ids]
            if _token_lists(ids):
                return list(ids)
            return _error(400, "input_ids must be token ids or a list of them", "input_ids")
        if isinstance(text, str):
            return [self.tokenizer.encode(text)]
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [self.tokenizer.encode(t) for t in text]
        return _error(400, "text must be a string or a list of strings", "text")

    async def generate(self, request: Request) -> Response:
        engine = self.engine
        body = await _object(request, optional=False)
        if isinstance(body, Response):
            return body
        batch = self._prompts(body)
        if isinstance(batch, Response):
            return batch
        sampling = _sampling_params(body)
        if isinstance(sampling, Response):
            return sampling
        params, stream = sampling
        for prompt in batch:
            problem = engine.validate(prompt, params)
            if problem:
                return _error(400, problem)
        rid = body.get("rid")
        rids = rid if isinstance(rid, list) else [rid] * len(batch)
        if len(rids) != len(batch):
            return _error(400, "rid must name one id per prompt", "rid")
        pendings = [self.svc.submit(p, params, stream) for p in batch]
        names = [
            r if isinstance(r, str) else p.seq.request_id
            for r, p in zip(rids, pendings, strict=True)
        ]
        if stream:
            return StreamingResponse(
                _stream(pendings, names, engine, self.answer), media_type="text/event-stream"
            )
        await _all_finished(engine, pendings)
        results = [self.answer(p.seq, n) for p, n in zip(pendings, names, strict=True)]
        return _json(
            results if len(batch) > 1 or isinstance(body.get("text"), list) else results[0]
        )

    # ------------------------------------------------------------------ control
    async def pause_generation(self, request: Request) -> Response:
        body = await _object(request)
        if isinstance(body, Response):
            return body
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return _error(400, "mode must be abort, retract or in_place", "mode")
        self.control.pause()
        aborted = self.control.abort_all() if mode == "abort" else 0
        return _json({"success": True, "message": f"paused ({mode})", "aborted": aborted})

    async def continue_generation(self, request: Request) -> Response:
        self.control.resume()
        return _json({"success": True, "message": "continued"})

    async def update_weights_from_disk(self, request: Request) -> Response:
        control = self.control
        body = await _object(request, optional=False)
        if isinstance(body, Response):
            return body
        if not isinstance(body.get("model_path"), str):
            return _error(400, "model_path must be a string", "model_path")
        if body.get("abort_all_requests") is True:
            control.abort_all()
        flushed = await control.flush()
        version = body.get("weight_version")
        control.weight_version = version if isinstance(version, str) else str(time.time())
        return _json(
            {
                "success": True,
                "message": "Succeeded to update model weights."
                + ("" if flushed else " (cache flushed once requests kept in place finish)"),
                "num_paused_requests": 0,
            }
        )

    async def release_memory(self, request: Request) -> Response:
        self.control.pause()
        await self.control.flush()
        self.control.sleeping = True
        return _json({"success": True})

    async def resume_memory(self, request: Request) -> Response:
        self.control.sleeping = False
        self.control.resume()
        return _json({"success": True})


class _VllmRoutes:
    """vLLM's pause and sleep routes."""

    def __init__(self, control: EngineControl) -> None:
        self.control = control

    async def pause(self, request: Request) -> Response:
        control = self.control
        mode = request.query_params.get("mode", "abort")
        if mode not in ("abort", "wait", "keep"):
            return _error(400, "mode must be abort, wait or keep", "mode")
        if mode == "wait":
            await control.until_idle()
        control.pause()
        if mode == "abort":
            control.abort_all()
        if request.query_params.get("clear_cache", "false").lower() == "true":
            await control.flush()
        return Response(b"", 200)

    async def resume(self, request: Request) -> Response:
        self.control.resume()
        return Response(b"", 200)

    async def is_paused(self, request: Request) -> Response:
        return _json({"is_paused": self.control.paused})

    async def sleep(self, request: Request) -> Response:
        control = self.control
        await control.until_idle()
        control.pause()
        await control.flush()
        control.sleeping = True
        return Response(b"", 200)

    async def wake_up(self, request: Request) -> Response:
        self.control.sleeping = False
        self.control.resume()
        return Response(b"", 200)

    async def is_sleeping(self, request: Request) -> Response:
        return _json({"is_sleeping": self.control.sleeping})


async def _all_finished(engine: Any, pendings: list[Any]) -> None:
    """Waits until the engine finishes every request of a batch; aborts those left if the
    wait is cut."""
    try:
        for pending in pendings:
            while pending.seq.finish_reason is None:
                pending.event.clear()
                await pending.event.wait()
    finally:
        for pending in pendings:
            if pending.seq.finish_reason is None:
                engine.abort(pending.seq.request_id)


async def _stream(
    pendings: list[Any], names: list[str], engine: Any, answer: Any
) -> AsyncIterator[bytes]:
    """SGLang's stream: an event per step with progress, text and ids cumulative; a batch's
    events carry `index`."""
    try:
        for index, (pending, name) in enumerate(zip(pendings, names, strict=True)):
            seq = pending.seq
            sent = -1
            while True:
                pending.event.clear()
                if seq.finish_reason is None and seq.num_output <= max(sent, 0):
                    await pending.event.wait()
                done = seq.finish_reason is not None
                if seq.num_output > sent or done:
                    sent = seq.num_output
                    event = answer(seq, name)
                    if len(pendings) > 1:
                        event["index"] = index
                    yield b"data: " + _encode(event) + b"\n\n"
                if done:
                    break
        yield b"data: [DONE]\n\n"
    finally:
        for pending in pendings:
            if pending.seq.finish_reason is None:
                engine.abort(pending.seq.request_id)
