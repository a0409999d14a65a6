"""The simulated engine behind HTTP: vLLM's or SGLang's OpenAI API, metrics and admin routes."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from thunder_mw.schemas.config import SimEngineSettings
from thunder_mw.sim import _metrics, responses_api, scripted_agent
from thunder_mw.sim._native_routes import native_routes
from thunder_mw.sim._request_validation import (
    Accepted,
    BodyProblem,
    check_prompt_text,
    check_token_ids,
    validate_chat,
    validate_completion,
    validate_messages,
    validate_responses,
)
from thunder_mw.sim.cost_model import get_profile
from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams, Sequence
from thunder_mw.sim.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "SimService",
    "add_sim_engine_arguments",
    "create_sim_app",
    "run_sim_engine",
    "settings_from_args",
]

_json_encode = responses_api.encode_json
_json_decode = msgspec.json.Decoder().decode

# Request fields the real engines read. Anything else is accepted, ignored and recorded
# (vLLM logs "present in the request but ignored"; SGLang ignores silently).
_COMMON_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "n",
        "stream",
        "stream_options",
        "stop",
        "stop_token_ids",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "logprobs",
        "user",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "best_of",
        "use_beam_search",
        "length_penalty",
        "priority",
        "request_id",
        "response_format",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "truncate_prompt_tokens",
        "add_special_tokens",
        "return_tokens_as_token_ids",
        "cache_salt",
        "kv_transfer_params",
        "vllm_xargs",
        "bad_words",
        "allowed_token_ids",
        "prompt_logprobs",
        "service_tier",
        "logits_processors",
        "return_token_ids",
        "prompt_embeds",
        "lora_request",
    }
)
_CHAT_FIELDS = _COMMON_FIELDS | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "documents",
    "echo",
    "reasoning_effort",
    "mm_processor_kwargs",
    "metadata",
    "store",
    "modalities",
    "audio",
    "prediction",
    "web_search_options",
    "function_call",
    "functions",
}
_COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "echo", "suffix"}


class SimService:
    """One simulated engine: the engine model, its tokenizer, and the task that paces its steps."""

    def __init__(self, settings: SimEngineSettings) -> None:
        self.settings = settings
        self.flavor = settings.flavor
        self.model_name = settings.model_name
        self.time_scale = settings.time_scale
        self.tokenizer: Tokenizer = load_tokenizer(settings.tokenizer_file)
        self.vocab_size: int | None = getattr(self.tokenizer, "vocab_size", None)
        config = EngineConfig(
            num_blocks=settings.num_blocks,
            block_size=settings.block_size,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_model_len=settings.max_model_len,
            profile=settings.profile,
            seed=settings.seed,
            host_kv_tokens=settings.host_kv_tokens,
            host_load_tokens_per_s=settings.host_kv_load_tokens_per_s,
            disk_kv_tokens=settings.disk_kv_tokens,
            disk_load_tokens_per_s=settings.disk_kv_load_tokens_per_s,
        )
        self.engine = Engine(config, self.tokenizer.filler_ids, get_profile(settings.profile))
        self.unknown_field_count = 0
        self.unknown_fields_last: list[str] = []
        self.unknown_fields_seen: set[str] = set()
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self.resumed = asyncio.Event()  # cleared while generation is paused (native_routes)
        self.resumed.set()
        self._driver: asyncio.Task[None] | None = None
        self._gen_window: deque[tuple[float, int]] = deque(maxlen=64)
        self.started_at = time.time()

    # -- the step loop ---------------------------------------------------------------------
    def start(self) -> None:
        if self._driver is None:
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    async def stop(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            try:
                await self._driver
            except asyncio.CancelledError:
                pass
            self._driver = None

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        deadline = loop.time()
        while True:
            if not self.resumed.is_set():
                await self.resumed.wait()
                deadline = loop.time()
                continue
            if not engine.has_work:
                self._wake.clear()
                idle_from = loop.time()
                await self._wake.wait()
                # Idle time passes on the engine's clock too (TTL pins run out in it).
                engine.advance(engine.now + (loop.time() - idle_from) * self.time_scale)
                deadline = loop.time()
                continue
            result = engine.step()
            if result is None:
                continue
            deadline = max(deadline, loop.time() - 0.05) + result.duration / self.time_scale
            delay = deadline - loop.time()
            # Results become visible when the step "ends"; sleep(0) still lets requests in.
            await asyncio.sleep(delay if delay > 0 else 0)
            for seq in result.progressed:
                seq.user_data.event.set()
            for seq in result.finished:
                seq.user_data.event.set()
            self._gen_window.append((loop.time(), engine.stats.generation_tokens))

    def recent_generation_throughput(self) -> float:
        if len(self._gen_window) < 2:
            return 0.0
        (t0, g0), (t1, g1) = self._gen_window[0], self._gen_window[-1]
        return (g1 - g0) / (t1 - t0) if t1 > t0 else 0.0

    def submit(
        self,
        prompt: list[int],
        params: SamplingParams,
        stream: bool,
        program_id: str | None = None,
    ) -> _Pending:
        pending = _Pending()
        rid = f"sim-{next(self._ids)}"
        seq = self.engine.add_request(
            rid, prompt, params, listener=pending, stream=stream, program_id=program_id
        )
        seq.user_data = pending
        pending.seq = seq
        self._wake.set()
        return pending

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids, or BodyProblem where vLLM's tokenizer refuses the text."""
        check_prompt_text(text)
        return self.tokenizer.encode(text)

    def record_unknown(self, body: dict[str, Any], known: frozenset[str]) -> None:
        unknown = [k for k in body if k not in known]
        if unknown:
            self.unknown_field_count += 1
            self.unknown_fields_last = unknown
            self.unknown_fields_seen.update(unknown)

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        """A fixed chat template: the text a real template would add is not what matters here."""
        parts = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(_part_text(p) for p in content)
            parts.append(f"<|{m.get('role', 'user')}|>\n{content or ''}\n")
            for call in m.get("tool_calls") or ():
                parts.append(_json_encode(call).decode() + "\n")
        parts.append("<|assistant|>\n")
        return "".join(parts)


def _part_text(part: Any) -> str:
    """The text of one content part (a bare string, or a text part); other parts add none."""
    if isinstance(part, str):
        return part
    text = part.get("text") if isinstance(part, dict) else None
    return text if isinstance(text, str) else ""


class _Pending:
    __slots__ = ("event", "seq")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.seq: Sequence

    # The engine calls these inside step(); the driver wakes waiters after the step's time.
    def on_progress(self, seq: Sequence) -> None:
        pass

    def on_finish(self, seq: Sequence) -> None:
        pass


def _agentic_context(body: dict[str, Any]) -> dict[str, Any]:
    """The vLLM router's per-request program context (`vllm_xargs.agentic_context`): the
    engine reads `program_id` and `kv_retention_ttl_seconds` from it for TTL pinning."""
    xargs = body.get("vllm_xargs")
    ctx = xargs.get("agentic_context") if isinstance(xargs, dict) else None
    return ctx if isinstance(ctx, dict) else {}


def _error(status: int, message: str, err_type: str, param: str | None = None) -> Response:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return Response(_json_encode(body), status, media_type="application/json")


async def _route_error(request: Request, exc: Exception) -> Response:
    """An unknown route or method, answered as vLLM's server answers it (FastAPI's default:
    `{"detail": "Not Found"}` JSON, a 405 with `Allow`), not Starlette's plain text; vLLM's
    own error-object handler is registered for FastAPI's HTTPException subclass, which the
    router does not raise."""
    assert isinstance(exc, HTTPException)
    return Response(
        _json_encode({"detail": exc.detail}),
        exc.status_code,
        headers=exc.headers,
        media_type="application/json",
    )


def _refusal(problem: BodyProblem) -> Response:
    return _error(400, str(problem), problem.err_type, problem.param)


def _json(data: Any, status: int = 200) -> Response:
    return Response(_json_encode(data), status, media_type="application/json")


def create_sim_app(engine_settings: SimEngineSettings) -> Starlette:
    """The ASGI app of one simulated engine; its step loop runs while the app is served."""
    svc = SimService(engine_settings)
    api = _OpenAIRoutes(svc)
    if svc.flavor == "vllm":
        flavored = [
            Route("/version", api.version, methods=["GET"]),
            Route("/load", api.load, methods=["GET"]),
            Route("/reset_prefix_cache", api.reset_prefix_cache, methods=["POST"]),
        ]
    else:
        flavored = [
            Route("/health_generate", api.health, methods=["GET"]),
            Route("/server_info", api.server_info, methods=["GET"]),
            Route("/get_server_info", api.server_info, methods=["GET"]),
            Route("/v1/loads", api.loads, methods=["GET"]),
            Route("/flush_cache", api.reset_prefix_cache, methods=["POST"]),
        ]
    routes = [
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/responses", api.responses, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics_route, methods=["GET"]),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/debug/unknown_fields", api.unknown_fields, methods=["GET"]),
        Route("/debug/state", api.sim_state, methods=["GET"]),
        *flavored,
        *native_routes(svc),
    ]

    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        svc.start()
        try:
            yield
        finally:
            await svc.stop()

    app = Starlette(
        routes=routes,
        lifespan=asynccontextmanager(lifespan),
        exception_handlers={HTTPException: _route_error},
    )
    app.state.sim = svc
    return app


async def _read_body(request: Request) -> dict[str, Any] | Response:
    """The request's JSON object, or the 400 vLLM answers instead."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":  # vLLM's validate_json_request
        return _error(
            400,
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
            "Bad Request",
        )
    raw = await request.body()
    try:
        body = _json_decode(raw)
    except msgspec.DecodeError as exc:
        # vLLM parses with Python's json, which also takes what msgspec refuses: lone
        # surrogates (escaped, or as their UTF-8-like bytes), NaN, a UTF-8 BOM.
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return _error(400, f"Invalid JSON: {exc}", "BadRequestError")
    except RecursionError:  # nested past the decoder's depth: FastAPI's answer under vLLM
        return _json({"detail": "There was an error parsing the body"}, 400)
    if not isinstance(body, dict):
        return _error(400, "The request body must be a JSON object", "BadRequestError")
    return body


def _usage(seq: Sequence) -> dict[str, Any]:
    return {
        "prompt_tokens": seq.prompt_len,
        "total_tokens": seq.prompt_len + seq.num_output,
        "completion_tokens": seq.num_output,
        "prompt_tokens_details": {"cached_tokens": max(seq.num_cached_tokens, 0)},
    }


def _completion_prompt(prompt: Any) -> str | list[int] | Response:
    """/v1/completions' `prompt`: a text, or token ids (still to be checked), or the 400 for
    a batch of prompts, which vLLM serves and the simulator does not."""
    if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    return _error(
        400, "`prompt` must be a string or a list of token ids", "BadRequestError", "prompt"
    )


def _choice(
    seq: Sequence, text: str, chat: bool, scripted: scripted_agent.ScriptedCall | None
) -> dict[str, Any]:
    """The one choice of a whole (not streamed) chat or text completion."""
    if scripted is not None:
        return {
            "index": 0,
            "message": scripted_agent.message(scripted),
            "logprobs": None,
            "finish_reason": "tool_calls",
            "stop_reason": None,
        }
    if chat:
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": seq.finish_reason,
            "stop_reason": None,
        }
    return {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": seq.finish_reason,
        "stop_reason": None,
        "prompt_logprobs": None,
    }


class _OpenAIRoutes:
    """The endpoints of the OpenAI API, the flavour's load and cache routes and the debug
    ones, over one SimService."""

    def __init__(self, svc: SimService) -> None:
        self.svc = svc
        self.engine = svc.engine
        self.tokenizer = svc.tokenizer

    def _wrong_model(self, body: dict[str, Any]) -> Response | None:
        """vLLM's 404 for a model it does not serve (after the body's types are checked)."""
        model = body.get("model")
        if model is not None:
            try:
                model.encode()
            except UnicodeEncodeError as exc:  # vLLM fails on a name with a lone surrogate so
                return _error(400, str(exc), "BadRequestError")
        if model is not None and model != self.svc.model_name:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return None

    def _sampling(self, body: dict[str, Any], accepted: Accepted, chat: bool) -> SamplingParams:
        max_tokens = accepted.max_tokens
        if max_tokens is None and not chat and self.svc.flavor == "vllm":
            max_tokens = 16  # vLLM's /v1/completions default
        ttl = _agentic_context(body).get("kv_retention_ttl_seconds")
        return SamplingParams(
            max_tokens=max_tokens,
            min_tokens=accepted.min_tokens,
            ignore_eos=accepted.ignore_eos,
            kv_ttl_s=float(ttl) if isinstance(ttl, int | float) and ttl > 0 else None,
        )

    def _prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int] | Response:
        """The prompt's token ids: the chat's rendered messages, or the completion's prompt.
        Raises BodyProblem where vLLM refuses the text or the ids."""
        svc = self.svc
        if chat:
            return svc.encode(svc.chat_prompt(body["messages"]))
        prompt = _completion_prompt(body["prompt"])
        if isinstance(prompt, str):
            return svc.encode(prompt)
        if isinstance(prompt, list):
            check_token_ids(prompt, svc.vocab_size)
        return prompt

    async def _generate(self, request: Request, chat: bool) -> Response:
        svc, engine = self.svc, self.engine
        body = await _read_body(request)
        if isinstance(body, Response):
            return body
        svc.record_unknown(body, _CHAT_FIELDS if chat else _COMPLETION_FIELDS)
        try:
            accepted = validate_chat(body) if chat else validate_completion(body)
        except BodyProblem as exc:
            return _refusal(exc)
        if (model := self._wrong_model(body)) is not None:
            return model
        try:
            prompt_ids = self._prompt_ids(body, chat)
        except BodyProblem as exc:
            return _refusal(exc)
        if isinstance(prompt_ids, Response):
            return prompt_ids
        params = self._sampling(body, accepted, chat)
        stream = accepted.stream
        scripted: scripted_agent.ScriptedCall | None = None
        if chat and svc.settings.scripted_agent:
            answer = _scripted_call(body["messages"], stream, svc.settings.seed)
            if isinstance(answer, Response):
                return answer
            scripted = answer
            # The engine generates as many tokens as the tool call's text takes.
            n = len(self.tokenizer.encode(scripted.arguments))
            params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True)
        problem = engine.validate(prompt_ids, params)
        if problem:
            return _error(400, problem, "BadRequestError")
        program = _agentic_context(body).get("program_id")
        pending = svc.submit(
            prompt_ids, params, stream, program if isinstance(program, str) else None
        )
        rid = ("chatcmpl-" if chat else "cmpl-") + pending.seq.request_id
        created = int(time.time())
        if stream:
            return StreamingResponse(
                _stream(svc, pending, rid, created, chat, accepted.include_usage, _usage),
                media_type="text/event-stream",
            )
        seq = pending.seq
        await _finished(engine, pending)
        text = self.tokenizer.decode(engine.output_ids(seq))
        return _json(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": svc.model_name,
                "choices": [_choice(seq, text, chat, scripted)],
                "usage": _usage(seq),
            }
        )

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def responses(self, request: Request) -> Response:
        """POST /v1/responses as vLLM serves it (plain text output)."""
        svc, engine = self.svc, self.engine
        body = await _read_body(request)
        if isinstance(body, Response):
            return body
        svc.record_unknown(body, responses_api.RESPONSES_FIELDS)
        try:
            accepted = validate_responses(body)
            messages = responses_api.input_messages(body)
        except BodyProblem as exc:
            return _refusal(exc)
        except responses_api.BadInput as exc:
            return _error(400, str(exc), "BadRequestError", exc.param)
        if (model := self._wrong_model(body)) is not None:
            return model
        try:
            prompt_ids = svc.encode(svc.chat_prompt(messages))
        except BodyProblem as exc:
            return _refusal(exc)
        params = SamplingParams(
            max_tokens=accepted.max_tokens,
            min_tokens=accepted.min_tokens,
            ignore_eos=accepted.ignore_eos,
        )
        problem = engine.validate(prompt_ids, params)
        if problem:
            return _error(400, problem, "BadRequestError")
        stream = accepted.stream
        pending = svc.submit(prompt_ids, params, stream)
        seq = pending.seq
        given_id = body.get("request_id")
        answer = _ResponsesAnswer(
            svc,
            body,
            given_id if isinstance(given_id, str) else f"resp_{seq.request_id}",
            int(time.time()),
            params.max_tokens or engine.config.max_model_len - len(prompt_ids),
        )
        if stream:
            return StreamingResponse(answer.events(pending), media_type="text/event-stream")
        await _finished(engine, pending)
        text = self.tokenizer.decode(engine.output_ids(seq))
        item = responses_api.message_item(f"msg_{seq.request_id}", text, "completed")
        return _json(answer.final(seq, [item]))

    async def models(self, request: Request) -> Response:
        svc = self.svc
        card = {
            "id": svc.model_name,
            "object": "model",
            "created": int(svc.started_at),
            "owned_by": "vllm" if svc.flavor == "vllm" else "sglang",
            "root": svc.model_name,
            "parent": None,
            "max_model_len": self.engine.config.max_model_len,
        }
        return _json({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        return Response(b"", 200)

    async def tokenize(self, request: Request) -> Response:
        svc = self.svc
        body = await _read_body(request)
        if isinstance(body, Response):
            return body
        if (model := self._wrong_model(body)) is not None:
            return model
        try:
            if "messages" in body:
                tokens = svc.encode(svc.chat_prompt(validate_messages(body["messages"])))
            else:
                tokens = svc.encode(str(body.get("prompt", "")))
        except BodyProblem as exc:
            return _refusal(exc)
        return _json(
            {
                "count": len(tokens),
                "max_model_len": self.engine.config.max_model_len,
                "tokens": tokens,
            }
        )

    async def metrics_route(self, request: Request) -> Response:
        return Response(_metrics.render(self.svc), media_type=_metrics.CONTENT_TYPE)

    async def reset_prefix_cache(self, request: Request) -> Response:
        ok = self.engine.reset_prefix_cache()
        if self.svc.flavor == "sglang":
            return Response(
                b"Cache flushed.\n" if ok else b"Cache not flushed.\n", 200 if ok else 400
            )
        return _json({"success": ok})

    async def version(self, request: Request) -> Response:
        return _json({"version": "0.32.0+sim"})

    async def load(self, request: Request) -> Response:
        return _json({"server_load": self.engine.num_running + self.engine.num_waiting})

    async def server_info(self, request: Request) -> Response:
        svc, engine = self.svc, self.engine
        cfg = engine.config
        return _json(
            {
                "model_path": svc.model_name,
                "served_model_name": svc.model_name,
                "max_total_num_tokens": engine.capacity_tokens,
                "page_size": cfg.block_size,
                "max_running_requests": cfg.max_num_seqs,
                "chunked_prefill_size": cfg.max_num_batched_tokens,
                "context_length": cfg.max_model_len,
                "version": "0.5.23+sim",
                "internal_states": [{"last_gen_throughput": svc.recent_generation_throughput()}],
            }
        )

    async def loads(self, request: Request) -> Response:
        engine = self.engine
        snap = engine.snapshot()
        st = engine.stats
        q = st.prefix_cache_queries
        return _json(
            {
                "timestamp": time.time(),
                "version": "0.5.23+sim",
                "dp_rank_count": 1,
                "loads": [
                    {
                        "dp_rank": 0,
                        "num_running_reqs": snap["num_running"],
                        "num_waiting_reqs": snap["num_waiting"],
                        "num_used_tokens": snap["used_tokens"],
                        "max_total_num_tokens": snap["capacity_tokens"],
                        "token_usage": snap["kv_usage"],
                        "cache_hit_rate": st.prefix_cache_hits / q if q else 0.0,
                        "gen_throughput": self.svc.recent_generation_throughput(),
                    }
                ],
            }
        )

    async def unknown_fields(self, request: Request) -> Response:
        svc = self.svc
        return _json(
            {
                "count": svc.unknown_field_count,
                "last": svc.unknown_fields_last,
                "seen": sorted(svc.unknown_fields_seen),
            }
        )

    async def sim_state(self, request: Request) -> Response:
        engine = self.engine
        st = engine.stats
        return _json(
            {
                "flavor": self.svc.flavor,
                "snapshot": engine.snapshot(),
                "step": engine.step_no,
                "sim_time_s": engine.now,
                "stats": {
                    "prefix_cache_queries": st.prefix_cache_queries,
                    "prefix_cache_hits": st.prefix_cache_hits,
                    "num_preemptions": st.num_preemptions,
                    "prompt_tokens": st.prompt_tokens,
                    "generation_tokens": st.generation_tokens,
                    "steps": st.steps,
                    "external_prefix_cache_queries": st.external_prefix_cache_queries,
                    "external_prefix_cache_hits": st.external_prefix_cache_hits,
                    "cached_by_source": st.cached_by_source,
                    "kv_load_tokens": st.kv_load_tokens,
                    "kv_load_seconds": st.kv_load_seconds,
                    "pins_created": st.pins_created,
                    "pins_released": st.pins_released,
                    "pins_expired": st.pins_expired,
                },
            }
        )


async def _stream(
    svc: SimService,
    pending: _Pending,
    rid: str,
    created: int,
    chat: bool,
    include_usage: bool,
    usage: Any,
) -> AsyncIterator[bytes]:
    engine = svc.engine
    tokenizer = svc.tokenizer
    seq = pending.seq
    obj = "chat.completion.chunk" if chat else "text_completion"
    base = {"id": rid, "object": obj, "created": created, "model": svc.model_name}
    sent = 0
    try:
        if chat:
            first = {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            yield b"data: " + _json_encode(first) + b"\n\n"
        while True:
            pending.event.clear()
            if seq.finish_reason is None and seq.num_output <= sent:
                await pending.event.wait()
            done = seq.finish_reason is not None
            new_ids = engine.output_ids(seq, sent)
            if new_ids or done:
                sent += len(new_ids)
                text = tokenizer.decode(new_ids)
                reason = seq.finish_reason if done else None
                if chat:
                    choice: dict[str, Any] = {
                        "index": 0,
                        "delta": {"content": text},
                        "logprobs": None,
                        "finish_reason": reason,
                    }
                else:
                    choice = {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": reason,
                        "stop_reason": None,
                    }
                yield b"data: " + _json_encode({**base, "choices": [choice]}) + b"\n\n"
            if done:
                break
        if include_usage:
            yield b"data: " + _json_encode({**base, "choices": [], "usage": usage(seq)}) + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        if seq.finish_reason is None:
            engine.abort(seq.request_id)


class _ResponsesAnswer:
    """One /v1/responses answer: the response object, whole or as vLLM's stream of events."""

    def __init__(
        self, svc: SimService, body: dict[str, Any], rid: str, created: int, max_out: int
    ) -> None:
        self.svc, self.body, self.rid, self.created, self.max_out = svc, body, rid, created, max_out

    def _object(self, output: list[dict[str, Any]], status: str, usage: Any) -> dict[str, Any]:
        return responses_api.response_object(
            self.body,
            self.rid,
            self.created,
            self.svc.model_name,
            output=output,
            status=status,
            max_output_tokens=self.max_out,
            usage=usage,
        )

    def final(self, seq: Sequence, output: list[dict[str, Any]]) -> dict[str, Any]:
        usage = responses_api.usage(seq.prompt_len, seq.num_output, max(seq.num_cached_tokens, 0))
        return self._object(output, responses_api.status_of(seq.finish_reason), usage)

    async def events(self, pending: _Pending) -> AsyncIterator[bytes]:
        engine, tokenizer, seq = self.svc.engine, self.svc.tokenizer, pending.seq
        events = responses_api.ResponseEvents(f"msg_{seq.request_id}")
        sent = 0
        try:
            for frame in events.start(self._object([], "in_progress", None)):
                yield frame
            while True:
                pending.event.clear()
                if seq.finish_reason is None and seq.num_output <= sent:
                    await pending.event.wait()
                done = seq.finish_reason is not None
                new_ids = engine.output_ids(seq, sent)
                if new_ids:
                    sent += len(new_ids)
                    yield events.delta(tokenizer.decode(new_ids))
                if done:
                    break
            item = responses_api.message_item(events.item_id, events.text, "completed")
            for frame in events.finish(self.final(seq, [item])):
                yield frame
        finally:
            if seq.finish_reason is None:
                engine.abort(seq.request_id)


# -- command line ------------------------------------------------------------------------------
def add_sim_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `thunder-mw sim-engine` (defaults from SimEngineSettings)."""
    d = SimEngineSettings()
    parser.add_argument("--flavor", choices=["vllm", "sglang"], default=d.flavor)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--num-blocks", type=int, default=d.num_blocks)
    parser.add_argument("--block-size", type=int, default=d.block_size)
    parser.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    parser.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    parser.add_argument("--max-model-len", type=int, default=d.max_model_len)
    parser.add_argument("--profile", default=d.profile, help="cost profile: h100-8b, cpu-tiny, ...")
    parser.add_argument(
        "--time-scale", type=float, default=d.time_scale, help="simulated seconds per wall second"
    )
    parser.add_argument("--model-name", default=d.model_name)
    parser.add_argument("--tokenizer-file", default=None, help="a tokenizers tokenizer.json")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--host-kv-tokens",
        type=int,
        default=d.host_kv_tokens,
        help="host-memory KV tier in tokens (0: none): evicted blocks load back on a hit",
    )
    parser.add_argument(
        "--host-kv-load-tokens-per-s",
        type=float,
        default=d.host_kv_load_tokens_per_s,
        help="host tier load speed (default: the profile's PCIe link / its KV bytes per token)",
    )
    parser.add_argument("--disk-kv-tokens", type=int, default=d.disk_kv_tokens)
    parser.add_argument(
        "--disk-kv-load-tokens-per-s", type=float, default=d.disk_kv_load_tokens_per_s
    )
    parser.add_argument(
        "--scripted-agent",
        action="store_true",
        help="answer chats with a scripted agent's bash tool calls (sim/scripted_agent.py)",
    )
    parser.add_argument("--log-level", default="warning")


def settings_from_args(args: argparse.Namespace) -> SimEngineSettings:
    return SimEngineSettings(
        flavor=args.flavor,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        profile=args.profile,
        time_scale=args.time_scale,
        model_name=args.model_name,
        tokenizer_file=args.tokenizer_file,
        seed=args.seed,
        host_kv_tokens=args.host_kv_tokens,
        host_kv_load_tokens_per_s=args.host_kv_load_tokens_per_s,
        disk_kv_tokens=args.disk_kv_tokens,
        disk_kv_load_tokens_per_s=args.disk_kv_load_tokens_per_s,
        scripted_agent=args.scripted_agent,
    )


def run_sim_engine(args: argparse.Namespace) -> int:
    """Serve one simulated engine until SIGINT/SIGTERM (uvicorn handles both)."""
    import uvicorn

    get_profile(args.profile)  # fail fast on a typo
    app = create_sim_app(settings_from_args(args))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


def _scripted_call(
    messages: list[Any], stream: bool, seed: int
) -> scripted_agent.ScriptedCall | Response:
    """Scripted agent mode's answer (sim/scripted_agent.py), or the 400 saying why not."""
    if stream:
        return _error(
            400, "scripted agent mode answers without streaming", "BadRequestError", "stream"
        )
    try:
        return scripted_agent.next_call(messages, seed)
    except scripted_agent.ScriptError as exc:
        return _error(400, str(exc), "BadRequestError", "messages")


async def _finished(engine: Engine, pending: _Pending) -> None:
    """Waits until the engine finishes `pending`'s sequence; aborts it if the wait is cut."""
    seq = pending.seq
    try:
        while seq.finish_reason is None:
            pending.event.clear()
            await pending.event.wait()
    finally:
        if seq.finish_reason is None:
            engine.abort(seq.request_id)
