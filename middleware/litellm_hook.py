"""thunder-mw inside LiteLLM's proxy: a LiteLLM callback whose pre-call hook runs the agent-context
and scheduling layers, so the scheduler's engine choice decides which deployment serves a call.

LiteLLM loads it from its config (`litellm_settings.callbacks`, a module beside the config
that builds one `ThunderScheduling`; docs/usage.md#inside-litellms-proxy). Why the pre-call
hook and not a custom routing strategy or an ASGI middleware around LiteLLM's app: it sees the
request body before LiteLLM forwards it, so it can read and strip the agent context; it is
awaited, so a held program waits inside it and a refusal is raised as the HTTP error; and it
may set `model` to a deployment id (`model_info.id`), which LiteLLM's router serves directly
(`Router.is_recognized_model`). The post-call hooks then hand the call's end and LiteLLM's
`usage` to the scheduler. A routing strategy only picks among healthy deployments and sees
neither the body's context nor the call's end; LiteLLM's command has no place to mount
middleware, and one would have to rewrite the body and parse every answer again.

Each thunder-mw backend's `name` is the id of the LiteLLM deployment that serves it (its `url`
is the same engine: thunder-mw's pool probes it for health and KV use). The admin API
(`/programs`, `/metrics`, `/programs/release`, ...) is served on `admin_port`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import msgspec
import uvicorn
from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger

from thunder_mw.middleware.agent_context import new_ephemeral_id
from thunder_mw.middleware.app import ThunderGateway
from thunder_mw.middleware.call_state import CallState, RequestBody
from thunder_mw.middleware.scheduling import Rejected
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import ThunderConfig
from thunder_mw.schemas.context_parsing import H_LITELLM_SESSION, ContextError
from thunder_mw.tools.refusal import ToolRefused

__all__ = ["SCHEDULED_CALLS", "ThunderScheduling"]

log = logging.getLogger("thunder_mw.litellm")

# LiteLLM's call types that run a model (the sync spellings too: the proxy passes either).
SCHEDULED_CALLS = frozenset(
    {"completion", "acompletion", "text_completion", "atext_completion"}
    | {"responses", "aresponses"}
)
# What request_info reads of a body: the prompt (its size) and the output limit.
_PROMPT_KEYS = ("messages", "prompt", "input", "instructions")
_LIMIT_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_encode = msgspec.json.Encoder().encode


class ThunderScheduling(CustomLogger):
    """One LiteLLM proxy's thunder-mw: context parsing, scheduling, Docker tools, admin API."""

    def __init__(
        self, config: ThunderConfig, *, admin_host: str = "127.0.0.1", admin_port: int = 0
    ) -> None:
        super().__init__()
        if config.agent_context.program_owner != "none":
            raise ValueError(
                "agent_context.program_owner is not supported inside LiteLLM's proxy: "
                "LiteLLM's own keys decide who may call; use `none`"
            )
        self.config = config
        self.gateway = ThunderGateway(config)
        self.core = self.gateway.core
        self.parser = self.core.context_layer.parser
        self.admin_host, self.admin_port = admin_host, admin_port
        self._calls: dict[str, CallState] = {}
        self._admin: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._starting: asyncio.Lock | None = None
        with contextlib.suppress(RuntimeError):
            # LiteLLM builds its callbacks in its start-up, on its loop: start with it, so
            # the admin API answers before the first call.
            asyncio.get_running_loop().create_task(self.start())

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Starts the pool's probes, the scheduler, the tools and the admin server, once."""
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if self.core.started:
                return
            await self.core.startup()
            if self.admin_port:
                self._admin = _EmbeddedServer(
                    uvicorn.Config(
                        self.gateway,
                        host=self.admin_host,
                        port=self.admin_port,
                        lifespan="off",  # the core is started here, on LiteLLM's loop
                        log_level="warning",
                        access_log=False,
                    )
                )
                self._serving = asyncio.create_task(self._admin.serve(), name="thunder-mw-admin")
            log.info("thunder-mw in LiteLLM: %d backend(s)", len(self.core.pool.backends))

    async def stop(self) -> None:
        if self._admin is not None and self._serving is not None:
            self._admin.should_exit = True
            await self._serving
        await self.core.shutdown()

    # ------------------------------------------------------------------ LiteLLM's hooks
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: str
    ) -> dict[str, Any]:
        if call_type not in SCHEDULED_CALLS:
            return data
        await self.start()
        try:
            ctx = self._context(data)
        except ContextError as exc:
            raise _http_error(exc.status, exc.message, exc.param, exc.code) from None
        if ctx is None:
            return data  # passthrough: LiteLLM routes it as it would without thunder-mw
        call = CallState(time.perf_counter())
        call.context = ctx
        prompt = {k: data[k] for k in (*_PROMPT_KEYS, *_LIMIT_KEYS) if k in data}
        call.body = RequestBody(prompt, _encode(prompt))
        try:
            if self.core.tools is not None and ctx.docker_ids:
                await self.core.tools.adopt(ctx)
            call.backend = await self.core.scheduler.admit(call)
        except ToolRefused as exc:
            raise _http_error(exc.status, exc.message, exc.param, exc.code) from None
        except Rejected as exc:
            raise _http_error(exc.status, exc.message, "program_id", exc.code) from None
        call.admission = self.core.scheduler
        if not _is_deployment(call.backend):
            call.end()
            raise _http_error(
                503,
                f"thunder-mw backend {call.backend!r} is not the id of a LiteLLM deployment: "
                "give each deployment `model_info: {id: <backend name>}`",
                "model",
                "backend_not_a_deployment",
            )
        call.forwarded_at = time.perf_counter()
        key = str(data.setdefault("litellm_call_id", f"thunder-mw-{id(call):x}"))
        self._calls[key] = call
        task = asyncio.current_task()
        if task is not None:
            # A client that leaves cancels the request's task and LiteLLM calls no post-call
            # hook: the call still ends, so its program does not stay REASONING.
            task.add_done_callback(lambda _: self._abandoned(key))
        data["model"] = call.backend  # the deployment whose id is the engine's label
        return data

    def _abandoned(self, key: str) -> None:
        call = self._calls.pop(key, None)
        if call is not None:
            call.outcome = "client_disconnected"
            call.end()

    async def async_post_call_success_hook(
        self, data: dict[str, Any], user_api_key_dict: Any, response: Any
    ) -> Any:
        call = self._calls.pop(str(data.get("litellm_call_id")), None)
        if call is not None:
            call.usage = _usage(getattr(response, "usage", None))
            call.status = 200
            call.end(answered=True)
        return response

    async def async_post_call_failure_hook(
        self,
        request_data: dict[str, Any],
        original_exception: Exception,
        user_api_key_dict: Any,
        traceback_str: str | None = None,
    ) -> None:
        call = self._calls.pop(str(request_data.get("litellm_call_id")), None)
        if call is not None:
            call.status = int(getattr(original_exception, "status_code", 500) or 500)
            call.outcome = "upstream_failed"
            call.end()

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        call = self._calls.pop(str(request_data.get("litellm_call_id")), None)
        finished = False
        try:
            async for chunk in response:
                if call is not None and getattr(chunk, "usage", None) is not None:
                    call.usage = _usage(chunk.usage)
                yield chunk
            finished = True
        finally:
            if call is not None:
                call.status = 200
                call.outcome = "ok" if finished else "client_disconnected"
                call.end(answered=finished)

    # ------------------------------------------------------------------ the context
    def _context(self, data: dict[str, Any]) -> AgentContext | None:
        """The agent context of a LiteLLM request, stripped from `data`: every convention
        thunder-mw reads (the client's `extra_body` arrives merged into the body), and
        LiteLLM's own `litellm_session_id` / `x-litellm-session-id` as the program."""
        headers = _headers(data)
        session = data.get("litellm_session_id")
        if isinstance(session, str) and all(n != H_LITELLM_SESSION for n, _ in headers):
            headers.append((H_LITELLM_SESSION, session.encode("latin-1", "replace")))
        ctx, _ = self.parser.parse(data, headers)
        if ctx is not None:
            return ctx
        mode = self.config.agent_context.on_missing
        if mode == "reject":
            raise ContextError(
                "this gateway requires agent context: send program_id, litellm_session_id "
                "or another supported convention with every request",
                "program_id",
                code="missing_agent_context",
            )
        if mode == "ephemeral":
            return AgentContext(program_id=new_ephemeral_id(), source=None, ephemeral=True)
        return None


class _EmbeddedServer(uvicorn.Server):
    """uvicorn on LiteLLM's loop: the signals stay LiteLLM's server's."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _is_deployment(label: str | None) -> bool:
    """Whether LiteLLM's router (when this runs inside its proxy) serves `label` as a
    deployment id; True outside the proxy, where there is no router to ask."""
    from litellm.proxy import proxy_server

    router = getattr(proxy_server, "llm_router", None)
    return router is None or (label is not None and bool(router.has_model_id(label)))


def _headers(data: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    """The client's request headers, as ASGI has them (LiteLLM keeps them in the data)."""
    request = data.get("proxy_server_request")
    raw = request.get("headers") if isinstance(request, dict) else None
    if not isinstance(raw, dict):
        return []
    return [
        (str(k).lower().encode("latin-1", "replace"), str(v).encode("latin-1", "replace"))
        for k, v in raw.items()
    ]


def _usage(usage: Any) -> Usage | None:
    """LiteLLM's usage object (OpenAI's fields) as the scheduler's."""
    if usage is None:
        return None
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return Usage(
        int(getattr(usage, "prompt_tokens", 0) or 0),
        int(getattr(usage, "completion_tokens", 0) or 0),
        int(cached or 0),
    )


def _http_error(status: int, message: str, param: str | None, code: str) -> HTTPException:
    """An error LiteLLM answers with `status` and OpenAI's error object."""
    return HTTPException(
        status_code=status,
        detail={"error": {"message": message, "type": code, "param": param, "code": status}},
    )
