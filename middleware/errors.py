"""OpenAI-style error answers, so clients' SDKs raise a typed error that names the bad field."""

from __future__ import annotations

from thunder_mw.middleware.types import Send
from thunder_mw.schemas.views import ErrorBody, ErrorDetail, encode

__all__ = ["error_body", "send_error", "send_json"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> bytes:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return encode(ErrorBody(error=ErrorDetail(message=message, type=kind, param=param, code=code)))


async def send_json(
    send: Send,
    status: int,
    body: bytes,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if extra_headers:
        headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(
    send: Send,
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await send_json(send, status, error_body(status, message, param, code), extra_headers)
