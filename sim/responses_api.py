"""The OpenAI Responses API as vLLM serves it: request fields, the response object, stream events.

Pure shapes, no engine: the simulated engine's `/v1/responses` route (sim/server.py) fills
them with what its engine generated. Field names and event order follow vLLM 0.32's
`vllm/entrypoints/openai/responses` (plain text output, no tools or reasoning): a stream is
`response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, one `response.output_text.delta` per step, then
`response.output_text.done`, `response.content_part.done`, `response.output_item.done` and
`response.completed`, whose `response.usage` carries `input_tokens_details.cached_tokens`.
Each event goes out as `event: TYPE` and `data: JSON` lines, as vLLM writes them.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

__all__ = [
    "RESPONSES_FIELDS",
    "BadInput",
    "ResponseEvents",
    "encode_json",
    "input_messages",
    "message_item",
    "response_object",
    "status_of",
    "usage",
]

_msgspec_encode = msgspec.json.Encoder().encode


def encode_json(data: Any) -> bytes:
    """JSON bytes of an answer that may echo the request's text back: a lone surrogate (which
    vLLM's parser lets in) goes out as its escape, as Python's json writes it, not a 500."""
    try:
        return _msgspec_encode(data)
    except UnicodeEncodeError:
        return json.dumps(data, ensure_ascii=True).encode()


_encode = encode_json

# Request fields vLLM's ResponsesRequest reads; anything else is recorded as ignored.
RESPONSES_FIELDS = frozenset(
    {
        "background",
        "include",
        "input",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "model",
        "logit_bias",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "reasoning",
        "include_reasoning",
        "service_tier",
        "store",
        "stream",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "top_k",
        "min_p",
        "truncation",
        "user",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "presence_penalty",
        "frequency_penalty",
        "prompt_cache_key",
        "watermarking",
        "request_id",
        "session_id",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "priority",
        "cache_salt",
        "enable_response_messages",
        "previous_input_messages",
        "structured_outputs",
        "repetition_penalty",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "vllm_xargs",
        "kv_transfer_params",
        "ec_transfer_params",
        "chat_template_kwargs",
    }
)


class BadInput(ValueError):
    """The request's `input` cannot be turned into messages; `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Chat messages for the engine's template: `instructions` as the system message, then
    `input` (a string, or a list of message items whose content is text or text parts)."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for i, item in enumerate(given):
            if not isinstance(item, dict) or "content" not in item:
                raise BadInput(f"input[{i}] must be a message item with `content`", f"input[{i}]")
            content = item["content"]
            if isinstance(content, list):
                content = "".join(
                    p.get("text", "") for p in content if isinstance(p, dict)
                )  # input_text / output_text parts
            elif not isinstance(content, str):
                raise BadInput(f"input[{i}].content must be text", f"input[{i}].content")
            messages.append({"role": item.get("role", "user"), "content": content})
    else:
        raise BadInput("`input` must be a string or a non-empty list of items", "input")
    return messages


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": cached_tokens,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [prompt_tokens],
            "cached_tokens_per_turn": [cached_tokens],
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [output_tokens],
            "tool_output_tokens_per_turn": [0],
        },
        "total_tokens": prompt_tokens + output_tokens,
    }


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    part: dict[str, Any] = {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": None,
    }
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "content": [part] if text else [],
        "status": status,
    }


def response_object(
    body: dict[str, Any],
    response_id: str,
    created: int,
    model: str,
    *,
    output: list[dict[str, Any]],
    status: str,
    max_output_tokens: int,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """vLLM's ResponsesResponse for a plain-text answer (echoing the request's settings)."""
    return {
        "id": response_id,
        "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata"),
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature", 1.0),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": body.get("top_p", 1.0),
        "background": body.get("background", False),
        "max_output_tokens": max_output_tokens,
        "max_tool_calls": body.get("max_tool_calls"),
        "previous_response_id": body.get("previous_response_id"),
        "prompt": body.get("prompt"),
        "reasoning": body.get("reasoning"),
        "service_tier": body.get("service_tier", "auto"),
        "status": status,
        "text": body.get("text"),
        "top_logprobs": body.get("top_logprobs", 0),
        "truncation": body.get("truncation", "disabled"),
        "usage": usage,
        "user": body.get("user"),
    }


class ResponseEvents:
    """Numbers and frames one streamed answer's events (`sequence_number` from 0)."""

    def __init__(self, item_id: str) -> None:
        self.item_id = item_id
        self.sequence = 0
        self.text = ""

    def frame(self, event_type: str, **fields: Any) -> bytes:
        event = {"type": event_type, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + event_type.encode() + b"\ndata: " + _encode(event) + b"\n\n"

    def start(self, in_progress: dict[str, Any]) -> list[bytes]:
        return [
            self.frame("response.created", response=in_progress),
            self.frame("response.in_progress", response=in_progress),
            self.frame(
                "response.output_item.added",
                output_index=0,
                item={**message_item(self.item_id, "", "in_progress"), "content": []},
            ),
            self.frame(
                "response.content_part.added",
                output_index=0,
                item_id=self.item_id,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            ),
        ]

    def delta(self, text: str) -> bytes:
        self.text += text
        return self.frame(
            "response.output_text.delta",
            content_index=0,
            output_index=0,
            item_id=self.item_id,
            delta=text,
            logprobs=[],
        )

    def finish(self, completed: dict[str, Any]) -> list[bytes]:
        item = message_item(self.item_id, self.text, "completed")
        part: dict[str, Any] = {
            "type": "output_text",
            "text": self.text,
            "annotations": [],
            "logprobs": None,
        }
        return [
            self.frame(
                "response.output_text.done",
                output_index=0,
                content_index=0,
                text=self.text,
                logprobs=[],
                item_id=self.item_id,
            ),
            self.frame(
                "response.content_part.done",
                item_id=self.item_id,
                output_index=0,
                content_index=0,
                part=part,
            ),
            self.frame("response.output_item.done", output_index=0, item=item),
            self.frame("response.completed", response=completed),
        ]
