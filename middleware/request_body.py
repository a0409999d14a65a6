"""Reading a request body once, within a byte limit, and decoding it as a JSON object.

Every layer that takes a body (the context layer, the forwarder mounted on its own, the
admin routes) reads it here, so the limit, the Content-Length check and the errors are the
same everywhere: 413 past the limit, 400 for a bad Content-Length, for invalid JSON or for
anything but an object.
"""

from __future__ import annotations

from typing import Any

import msgspec

from thunder_mw.middleware.types import Receive, Scope

__all__ = ["BodyError", "ClientLeft", "decode_object", "read_body"]

_decode = msgspec.json.Decoder().decode


class BodyError(Exception):
    """Why a request has no usable body: answered as an OpenAI-style error naming `body`."""

    def __init__(self, status: int, message: str, code: str, param: str = "body") -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.param = param


class ClientLeft(Exception):
    """The client disconnected before its body arrived: nobody is there to answer."""


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole body, refused early when Content-Length already says it is too large."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            if not value.isdigit():
                raise BodyError(400, "invalid Content-Length", "invalid_body")
            if int(value) > limit:
                raise _too_large(limit)
            break
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientLeft()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def decode_object(raw: bytes, *, for_engine: bool = False) -> dict[str, Any]:
    """The body as a JSON object, or a BodyError saying what it is instead. `for_engine`:
    a body on its way to an engine, whose integers must also fit 64 bits."""
    if not raw:
        raise BodyError(400, "request body is empty; expected a JSON object", "invalid_body")
    try:
        data = _decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: nested deeper than the decoder goes, yet under the byte limit.
        raise BodyError(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(data, dict):
        raise BodyError(400, "request body must be a JSON object", "invalid_body")
    if for_engine:
        _check_integers(data)
    return data


_INT64 = (-(2**63), 2**63 - 1)
# Fields the engines read as integers (OpenAI's and vLLM's sampling and length fields, SGLang's
# `sampling_params`): JSON allows any size, the engines 64 bits (vLLM answers 500 for
# `top_k: 10**30` on /v1/responses). Other fields pass through untouched, whatever their size.
_ENGINE_INTEGERS = frozenset(
    {
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "min_tokens",
        "max_new_tokens",
        "min_new_tokens",
        "top_k",
        "n",
        "best_of",
        "seed",
        "logprobs",
        "top_logprobs",
        "prompt_logprobs",
        "truncate_prompt_tokens",
    }
)


def _check_integers(data: dict[str, Any]) -> None:
    """An engine-read integer past 64 bits is a 400 naming the field, not an engine's 500."""
    _check_fields(data, "")
    nested = data.get("sampling_params")
    if isinstance(nested, dict):
        _check_fields(nested, "sampling_params.")


def _check_fields(fields: dict[str, Any], prefix: str) -> None:
    low, high = _INT64
    for name in _ENGINE_INTEGERS.intersection(fields):
        item = fields[name]
        if type(item) is int and not low <= item <= high:
            raise BodyError(
                400,
                f"{prefix}{name} is {item}, outside the 64-bit integer range engines accept",
                "integer_out_of_range",
                prefix + name,
            )


def _too_large(limit: int) -> BodyError:
    return BodyError(413, f"request body exceeds the {limit}-byte limit", "body_too_large")
