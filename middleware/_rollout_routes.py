"""The RL-rollout admin endpoints: thunder-mw's own `/backends`, `/generation` and
`/weights/update`, and the spellings rollout frameworks already speak (SGLang router's worker
API; SGLang's and vLLM's pause, update, sleep and cache routes), all over middleware/_fleet.py.
They are rows of the operation table in middleware/openapi.py like every admin route."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import quote

import msgspec
import pydantic
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from thunder_mw.engines.pool import Backend, BackendPool
from thunder_mw.middleware._fleet import Fleet, FleetError
from thunder_mw.middleware.errors import error_body
from thunder_mw.middleware.request_body import BodyError, ClientLeft, decode_object, read_body
from thunder_mw.schemas.config import BackendSettings
from thunder_mw.schemas.rollout_views import (
    BackendChange,
    BackendList,
    GenerationState,
    IsPaused,
    IsSleeping,
    PauseMode,
    PauseRequest,
    WeightUpdateRequest,
    WorkerAccepted,
    WorkerChanged,
    WorkerInfo,
    WorkerList,
    WorkerRequest,
    WorkerStats,
    WorkerUrls,
)
from thunder_mw.schemas.views import encode

_MAX_BODY = 64 * 1024
_JSON = "application/json"
_SGLANG_MODES: dict[str, PauseMode] = {"abort": "abort", "retract": "keep", "in_place": "keep"}
_VLLM_MODES: dict[str, PauseMode] = {"abort": "abort", "wait": "wait", "keep": "keep"}
T = TypeVar("T")


class _Refused(Exception):
    def __init__(self, status: int, message: str, param: str | None, code: str) -> None:
        super().__init__(message)
        self.response = Response(error_body(status, message, param, code), status, media_type=_JSON)


def _json(view: Any, status: int = 200) -> Response:
    return Response(encode(view), status, media_type=_JSON)


async def _body(request: Request, optional: bool = False) -> dict[str, Any]:
    try:
        raw = await read_body(request.scope, request.receive, _MAX_BODY)
        if optional and not raw.strip():
            return {}
        return decode_object(raw)
    except BodyError as exc:
        raise _Refused(exc.status, exc.message, exc.param, exc.code) from None
    except ClientLeft:
        raise ClientDisconnect() from None


def _convert(data: dict[str, Any], kind: type[T]) -> T:
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `$")
        param = where.rstrip("`").lstrip(".") or None
        raise _Refused(400, f"{param or 'body'}: {message}", param, "invalid_body") from None


def _settings(data: dict[str, Any]) -> BackendSettings:
    """The YAML model validates it, so a run-time engine obeys the same rules (no credentials
    in the URL, a URL unless type is sim, ...)."""
    try:
        return BackendSettings.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise _Refused(
            400, f"{param or 'body'}: {first['msg']}", param, "invalid_backend"
        ) from None


def _query(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise _Refused(400, f"the `{name}` query parameter is required", name, "invalid_request")
    return value


def _worker_info(backend: Backend, calls: int) -> WorkerInfo:
    return WorkerInfo(
        id=backend.label,
        url=backend.url,
        model_id=None,
        worker_type="regular",
        is_healthy=backend.healthy,
        load=calls,
        connection_mode="Http",
        draining=backend.draining,
    )


class RolloutRoutes:
    """Endpoint methods named by the operation table as `rollout.<method>`."""

    def __init__(self, fleet: Fleet, pool: BackendPool) -> None:
        self.fleet = fleet
        self.pool = pool

    async def _guarded(self, work: Callable[[], Awaitable[Response]]) -> Response:
        try:
            return await work()
        except _Refused as exc:
            return exc.response
        except FleetError as exc:
            return Response(
                error_body(exc.status, exc.message, exc.param, exc.code),
                exc.status,
                media_type=_JSON,
            )

    def _listed(self) -> list[Backend]:
        return list(self.pool.backends)

    # ------------------------------------------------------------------ /backends
    async def list_backends(self, request: Request) -> Response:
        views = [b.describe() for b in self._listed()]
        return _json(BackendList(backends=views, count=len(views)))

    async def add_backend(self, request: Request) -> Response:
        async def work() -> Response:
            data = await _body(request)
            if not isinstance(data.get("sim", {}), dict | None):
                raise _Refused(400, "sim must be an object", "sim", "invalid_backend")
            backend = await self.fleet.add(_settings(data))
            return _json(BackendChange(backend=backend.describe(), message="added"), 201)

        return await self._guarded(work)

    async def drain_backend(self, request: Request) -> Response:
        async def work() -> Response:
            backend = self.fleet.drain(request.path_params["name"])
            message = "draining: no new programs; it leaves once its calls have finished"
            return _json(BackendChange(backend=backend.describe(), message=message), 202)

        return await self._guarded(work)

    # ------------------------------------------------------------------ SGLang router's API
    async def add_worker(self, request: Request) -> Response:
        async def work() -> Response:
            url = _query(request, "url")
            if self.fleet.by_url(url) is None:
                await self.fleet.add(_settings({"type": "sglang", "url": url}))
            return _json(self._changed(f"Successfully added worker: {url}"))

        return await self._guarded(work)

    async def remove_worker(self, request: Request) -> Response:
        async def work() -> Response:
            url = _query(request, "url")
            backend = self.fleet.by_url(url)
            if backend is None:
                raise _Refused(404, f"no worker at {url}", "url", "backend_not_found")
            self.fleet.drain(backend.label)
            return _json(self._changed(f"Successfully removed worker: {url} (draining)"))

        return await self._guarded(work)

    def _changed(self, message: str) -> WorkerChanged:
        urls = [b.url for b in self._listed() if not b.draining]
        return WorkerChanged(status="success", message=message, worker_urls=urls)

    async def list_workers(self, request: Request) -> Response:
        return _json(WorkerUrls(urls=[b.url for b in self._listed() if not b.draining]))

    async def workers(self, request: Request) -> Response:
        calls = self.fleet.scheduler.calls
        infos = [_worker_info(b, calls[b.label]) for b in self._listed()]
        stats = WorkerStats(prefill_count=0, decode_count=0, regular_count=len(infos))
        return _json(WorkerList(workers=infos, total=len(infos), stats=stats))

    async def create_worker(self, request: Request) -> Response:
        async def work() -> Response:
            worker = _convert(await _body(request), WorkerRequest)
            if worker.worker_type != "regular":
                raise _Refused(
                    400,
                    "prefill/decode workers are not supported: register regular workers",
                    "worker_type",
                    "invalid_body",
                )
            backend = self.fleet.by_url(worker.url)
            if backend is None:
                data: dict[str, Any] = {"type": "sglang", "url": worker.url}
                if worker.api_key:
                    data["api_key"] = worker.api_key
                backend = await self.fleet.add(_settings(data))
            return _json(self._accepted(backend, f"worker {backend.url} added"), 202)

        return await self._guarded(work)

    async def delete_worker(self, request: Request) -> Response:
        async def work() -> Response:
            ref = request.path_params["worker_id"]
            backend = self.pool.get(ref) or self.fleet.by_url(ref)
            if backend is None or backend not in self.pool.backends:
                raise _Refused(404, f"no worker {ref!r}", "worker_id", "backend_not_found")
            self.fleet.drain(backend.label)
            return _json(self._accepted(backend, f"worker {backend.url} draining"), 202)

        return await self._guarded(work)

    @staticmethod
    def _accepted(backend: Backend, message: str) -> WorkerAccepted:
        return WorkerAccepted(
            status="accepted",
            worker_id=backend.label,
            url=backend.url,
            location="/workers/" + quote(backend.label, safe=""),
            message=message,
        )

    # ------------------------------------------------------------------ generation gate
    async def generation(self, request: Request) -> Response:
        return _json(self.fleet.state([], "generation paused" if self._paused else "running"))

    @property
    def _paused(self) -> bool:
        return self.fleet.scheduler.paused_generation

    async def pause(self, request: Request) -> Response:
        async def work() -> Response:
            asked = _convert(await _body(request, optional=True), PauseRequest)
            return _json(await self.fleet.pause(asked.mode, asked.timeout_s))

        return await self._guarded(work)

    async def resume(self, request: Request) -> Response:
        async def work() -> Response:
            return _json(await self.fleet.resume())

        return await self._guarded(work)

    async def update_weights(self, request: Request) -> Response:
        async def work() -> Response:
            data = await _body(request)
            asked = _convert(data, WeightUpdateRequest)
            forwarded = {k: v for k, v in data.items() if k not in ("mode", "timeout_s")}
            state = await self.fleet.update_weights(forwarded, asked.mode, asked.timeout_s)
            return _json(state)

        return await self._guarded(work)

    # ------------------------------------------------------------------ engines' spellings
    async def sglang_pause(self, request: Request) -> Response:
        async def work() -> Response:
            data = await _body(request, optional=True)
            mode = data.get("mode", "abort")
            if mode not in _SGLANG_MODES:
                raise _Refused(
                    400, "mode must be abort, retract or in_place", "mode", "invalid_body"
                )
            return _json(await self.fleet.pause(_SGLANG_MODES[mode], 300.0))

        return await self._guarded(work)

    async def sglang_update(self, request: Request) -> Response:
        async def work() -> Response:
            data = await _body(request)
            if not isinstance(data.get("model_path"), str):
                raise _Refused(400, "model_path must be a string", "model_path", "invalid_body")
            mode: PauseMode = "abort" if data.get("abort_all_requests") is True else "wait"
            return _json(await self.fleet.update_weights(data, mode, 300.0))

        return await self._guarded(work)

    async def flush_cache(self, request: Request) -> Response:
        async def work() -> Response:
            return _json(await self.fleet.flush_cache())

        return await self._guarded(work)

    async def vllm_pause(self, request: Request) -> Response:
        async def work() -> Response:
            mode = request.query_params.get("mode", "abort")
            if mode not in _VLLM_MODES:
                raise _Refused(400, "mode must be abort, wait or keep", "mode", "invalid_request")
            return _json(await self.fleet.pause(_VLLM_MODES[mode], 300.0))

        return await self._guarded(work)

    async def is_paused(self, request: Request) -> Response:
        return _json(IsPaused(is_paused=self._paused))

    async def sleep(self, request: Request) -> Response:
        async def work() -> Response:
            raw = request.query_params.get("level", "1")
            if raw not in ("1", "2"):
                raise _Refused(400, "level must be 1 or 2", "level", "invalid_request")
            return _json(await self.fleet.sleep(int(raw), 300.0))

        return await self._guarded(work)

    async def wake_up(self, request: Request) -> Response:
        async def work() -> Response:
            return _json(await self.fleet.wake_up())

        return await self._guarded(work)

    async def is_sleeping(self, request: Request) -> Response:
        return _json(IsSleeping(is_sleeping=self.fleet.sleeping))


__all__ = ["GenerationState", "RolloutRoutes"]
