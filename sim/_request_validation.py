"""What vLLM answers 400 to, so the simulated engine refuses the same bodies the same way.

vLLM 0.32 validates a request in three places, and this module mirrors each in the same order:

1. its pydantic request models (`ChatCompletionRequest`, `CompletionRequest`,
   `ResponsesRequest`, `extra="allow"`) in pydantic's lax mode: `"5"` is 5, `true` is 1,
   `"yes"` is true, `1.5` is not an int. The models below declare the fields vLLM types, with
   vLLM's types, and use pydantic itself: msgspec's lax mode was measured to differ from
   pydantic's on a dozen such coercions (`" 5 "`, `"1_000"`, `"on"`, `1.0` as a bool), and every
   difference is a body one engine serves and the other refuses. A type error answers as vLLM's
   `validation_exception_handler` does: type `Bad Request`, `param` `body.<field>`.
2. the models' `mode="before"` validators, which read the raw body (`stream_options` without
   `stream`, `top_logprobs` without `logprobs`, `tool_choice` without `tools`, `cache_salt`).
3. `SamplingParams._verify_args` on the converted values (ranges: `max_tokens >= 1`,
   `temperature` in [0, 2], `top_p` in (0, 1], ...), type `BadRequestError`.

The context-length check (prompt plus `max_tokens` against `max_model_len`) stays in
`Engine.validate`: it needs the prompt's tokens. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, Required

import msgspec
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs this one on Python < 3.12

__all__ = [
    "AGENTIC_CONTEXT",
    "Accepted",
    "BodyProblem",
    "ChatBody",
    "CompletionBody",
    "Int64",
    "ResponsesBody",
    "Stop",
    "TopLogprobs",
    "check_prompt_text",
    "check_token_ids",
    "validate_chat",
    "validate_completion",
    "validate_messages",
    "validate_responses",
]

# `vllm_xargs.agentic_context`: the vLLM router's per-request program context (sim/server.py).
AGENTIC_CONTEXT = "agentic_context"
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_MAX_N_SEQUENCES = 16384  # vLLM's VLLM_MAX_N_SEQUENCES default
_MAX_LOGPROBS = 20  # vLLM's --max-logprobs default (-1 asks for the whole vocabulary)
_MAX_STOP_STRINGS = 4  # vLLM's VLLM_MAX_STOP_STRINGS default
_MAX_CACHE_SALT_LENGTH = 128
_CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")

Int64 = Annotated[int, Field(ge=_INT64_MIN, le=_INT64_MAX)]
# vLLM's TopLogprobsParam: null means the same as omitted.
TopLogprobs = Annotated[int, BeforeValidator(lambda v: 0 if v is None else v)]
Stop = str | Annotated[list[str], Field(max_length=_MAX_STOP_STRINGS)] | None


class BodyProblem(ValueError):
    """A body vLLM would refuse: the message, vLLM's error type and the field it names."""

    def __init__(self, message: str, param: str | None, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.param = param
        self.err_type = err_type


class _Message(TypedDict, total=False):
    """One chat message as vLLM's `CustomChatCompletionMessageParam` reads it: a role is
    required, content is text, a list of content parts, or null (see `_check_message`)."""

    role: Required[str]
    content: NotRequired[str | list[Any] | None]
    name: NotRequired[str]
    tool_call_id: NotRequired[str | None]
    tool_calls: NotRequired[list[Any] | None]


# Roles of OpenAI's message types that ignore a `tool_calls` key (vLLM's union of message
# types falls through to them); any other role's tool calls must be well formed.
_ROLES_WITHOUT_TOOL_CALLS = frozenset({"user", "system", "developer"})
# Content parts a text-only model reads; the others are refused ("not a multimodal model").
_TEXT_PARTS = {"text": "text", "refusal": "refusal"}


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _Sampling(BaseModel):
    """The sampling fields chat and completions share, typed as vLLM types them."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    max_tokens: int | None = None
    n: int | None = 1
    seed: Int64 | None = None
    stop: Stop = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    watermarking: bool | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=_INT64_MAX)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    add_special_tokens: bool = False
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    priority: Int64 = 0
    request_id: str | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    stream_interval: Annotated[int, Field(ge=1)] | None = None


class ChatBody(_Sampling):
    messages: list[_Message]
    logprobs: bool | None = False
    top_logprobs: TopLogprobs = 0
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = "none"
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    include_reasoning: bool = True
    parallel_tool_calls: bool | None = True
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    session_id: str | None = None


_TokenId = Annotated[int, Field(ge=0)]


class CompletionBody(_Sampling):
    prompt: list[_TokenId] | list[list[_TokenId]] | str | list[str] | None = None
    echo: bool | None = False
    logprobs: int | None = None
    n: int = 1
    suffix: str | None = None


class ResponsesBody(BaseModel):
    """The fields of vLLM's `ResponsesRequest` the simulated route reads or that are typed
    simply; `input` items are checked by responses_api.input_messages."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    top_logprobs: TopLogprobs = 0
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: float | None = None
    seed: Int64 | None = None
    stop: Stop = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    store: bool | None = True
    background: bool | None = False
    parallel_tool_calls: bool | None = True
    max_tool_calls: int | None = None
    previous_response_id: str | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    prompt_cache_key: str | None = None
    request_id: str | None = None
    session_id: str | None = None
    priority: Int64 = 0
    metadata: dict[str, str] | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None


_MESSAGES = TypeAdapter(list[_Message])


def check_prompt_text(text: str) -> None:
    """A prompt the tokenizer cannot take (a lone surrogate, which vLLM's JSON parser lets
    through) is vLLM's 400 from its tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BodyProblem(
            "TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]",
            None,
        ) from None


def check_token_ids(ids: list[int], vocab_size: int | None) -> None:
    """Token ids past the vocabulary, refused as vLLM refuses them."""
    if vocab_size is None:
        return
    for token in ids:
        if token >= vocab_size:
            raise BodyProblem(f"Token id {token} is out of vocabulary", None)


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """`messages` as vLLM's /tokenize and chat routes type them, or BodyProblem."""
    try:
        checked: list[dict[str, Any]] = _MESSAGES.validate_python(messages)  # type: ignore[assignment]
    except ValidationError as exc:
        raise _type_problem(exc, ("messages",)) from None
    for i, message in enumerate(checked):
        _check_message(message, f"body.messages.{i}")
    return checked


def _check_message(message: dict[str, Any], where: str) -> None:
    """What vLLM's union of message types refuses beyond the fields' own types."""
    role = message["role"]
    content = message.get("content", "")
    if content is None and role != "assistant":
        raise BodyProblem(
            f"{where}.content: only an assistant message may have null content",
            f"{where}.content",
            "Bad Request",
        )
    if isinstance(content, list):
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
            if key is None or not isinstance(part.get(key), str):
                raise BodyProblem(
                    f"{where}.content.{j}: a content part must be an object "
                    '`{"type": "text", "text": "..."}` (the model reads text only)',
                    f"{where}.content.{j}",
                    "Bad Request",
                )
    calls = message.get("tool_calls")
    if calls and role not in _ROLES_WITHOUT_TOOL_CALLS:
        for j, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not (
                isinstance(call.get("id") if isinstance(call, dict) else None, str)
                and isinstance(function, dict)
                and isinstance(function.get("name"), str)
                and isinstance(function.get("arguments"), str)
            ):
                raise BodyProblem(
                    f"{where}.tool_calls.{j}: a tool call needs `id`, `type` and "
                    "`function` with `name` and `arguments` strings",
                    f"{where}.tool_calls.{j}",
                    "Bad Request",
                )


@dataclass(frozen=True)
class Accepted:
    """What the simulated engine reads from a body vLLM would serve."""

    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool


def validate_chat(body: dict[str, Any]) -> Accepted:
    """The fields of a /v1/chat/completions body, or BodyProblem as vLLM would answer."""
    _cache_salt(body)
    _stream_options(body)
    _logprobs(body)
    _tool_usage(body)
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise BodyProblem(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", None
        )
    req = _convert(ChatBody, body)
    for i, message in enumerate(req.messages):
        _check_message(message, f"body.messages.{i}")
    if req.continue_final_message and req.add_generation_prompt:  # the renderer's check
        raise BodyProblem(
            "continue_final_message and add_generation_prompt are not compatible.", None
        )
    if not req.messages:
        raise BodyProblem(
            "Cannot apply chat template to an empty conversation. Provide at least one message.",
            None,
        )
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    logprobs = req.top_logprobs if req.logprobs else None
    _verify_sampling(req, limit, logprobs)
    _max_logprobs(logprobs, "logprobs")
    return _accepted(req, limit)


def validate_completion(body: dict[str, Any]) -> Accepted:
    """The fields of a /v1/completions body, or BodyProblem as vLLM would answer."""
    _cache_salt(body)
    _stream_options(body)
    for name in ("prompt_logprobs", "logprobs"):
        value = body.get(name)
        if value is not None and not isinstance(value, int | float):
            raise BodyProblem(f"`{name}` must be an integer.", name)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) > 1 and _token_ids(prompt):
        # Agent contexts as token ids run to thousands: checked in C, not item by item in
        # pydantic (100 µs for 2,000 ids); the rest of the body as usual.
        req = _convert(CompletionBody, {**body, "prompt": [0]})
    else:
        req = _convert(CompletionBody, body)
    if req.prompt is None:
        raise BodyProblem("Either prompt or prompt_embeds must be provided and non-empty.", None)
    if req.suffix:  # the simulated model, like the tiny one, has no fill-in-the-middle
        raise BodyProblem("suffix is only supported for models with FIM completion rendering", None)
    _verify_sampling(req, req.max_tokens, req.logprobs)
    _max_logprobs(req.logprobs, "logprobs")
    return _accepted(req, req.max_tokens)


def _token_ids(prompt: list[Any]) -> bool:
    """Whether `prompt` is a list of non-negative ints (no bools, which pydantic would take)."""
    try:
        ids = _INT_LIST(prompt)
    except msgspec.ValidationError:
        return False
    return min(ids) >= 0


def _int_list(value: list[Any]) -> list[int]:
    return msgspec.convert(value, list[int], strict=True)


_INT_LIST = _int_list


def validate_responses(body: dict[str, Any]) -> Accepted:
    """The fields of a /v1/responses body the simulated route reads, checked as vLLM does."""
    req = _convert(ResponsesBody, body)
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise BodyProblem(
            f"max_tokens must be at least 1, got {req.max_output_tokens}.", "max_tokens"
        )
    _verify_ranges(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        max_tokens=req.max_output_tokens,
        min_tokens=0,
    )
    _logit_bias(req.logit_bias)
    _extra_args(req.vllm_xargs)
    return Accepted(
        max_tokens=req.max_output_tokens,
        min_tokens=0,  # not a field of vLLM's ResponsesRequest: ignored
        ignore_eos=req.ignore_eos,
        stream=bool(req.stream),
        include_usage=False,
    )


def _convert(model: type[BaseModel], body: dict[str, Any]) -> Any:
    xargs = body.get("vllm_xargs")
    if isinstance(xargs, dict) and isinstance(xargs.get(AGENTIC_CONTEXT), dict):
        # The one place the simulator is not vLLM 0.32: it also plays the engine the vLLM
        # router schedules, which reads an object here (vLLM types these values as scalars).
        rest = {k: v for k, v in xargs.items() if k != AGENTIC_CONTEXT}
        body = {**body, "vllm_xargs": rest}
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _type_problem(exc, ()) from None


def _type_problem(exc: ValidationError, prefix: tuple[str, ...]) -> BodyProblem:
    """A pydantic error as vLLM's handler words it: the first error's field as `param`."""
    errors = exc.errors(include_url=False, include_context=False)
    locs = [
        ".".join(["body", *prefix, *(str(p) for p in e["loc"] if not _internal(p))]) for e in errors
    ]
    label = "error" if len(errors) == 1 else "errors"
    lines = "".join(
        f"  {{'type': {e['type']!r}, 'loc': {loc!r}, 'msg': {e['msg']!r}, "
        f"'input': {_summary(e.get('input'))!r}}}\n"
        for e, loc in zip(errors[:10], locs, strict=False)
    )
    more = f"  ...and {len(errors) - 10} more {label}" if len(errors) > 10 else ""
    message = f"{len(errors)} validation {label}:\n{lines}{more}".rstrip()
    return BodyProblem(message, locs[0], "Bad Request")


def _summary(value: object) -> object:
    """A bounded stand-in for the offending value, as vLLM echoes it (containers by size)."""
    if isinstance(value, list | tuple | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else text


def _internal(segment: object) -> bool:
    """pydantic's union-branch and wrapper markers in a `loc`, which vLLM drops from `param`."""
    text = str(segment)
    return any(c in text for c in "[]{}()") or text in {"str", "int", "float", "bool", "list"}


def _cache_salt(body: dict[str, Any]) -> None:
    salt = body.get("cache_salt")
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise BodyProblem(
            "Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt"
        )
    if len(salt) > _MAX_CACHE_SALT_LENGTH or any(c in _CACHE_SALT_FORBIDDEN for c in salt):
        raise BodyProblem(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\\\', or NUL.",
            "cache_salt",
        )


def _stream_options(body: dict[str, Any]) -> None:
    # vLLM reads the raw values' truthiness here, before any conversion.
    if body.get("stream_options") and not body.get("stream"):
        raise BodyProblem(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )


def _logprobs(body: dict[str, Any]) -> None:
    """vLLM's `check_logprobs`, on the raw body (so `"2"` is refused here, not coerced)."""
    if body.get("logprob_token_ids") and not body.get("logprobs"):
        raise BodyProblem(
            "when using `logprob_token_ids`, `logprobs` must be set to true.",
            "logprob_token_ids",
        )
    for name in ("prompt_logprobs", "top_logprobs"):
        value = body.get(name)
        if value is not None and not isinstance(value, int | float):
            raise BodyProblem(f"`{name}` must be an integer.", name)
    prompt_logprobs = body.get("prompt_logprobs")
    if prompt_logprobs is not None:
        if body.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise BodyProblem(
                "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs"
            )
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise BodyProblem(
                "`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs"
            )
    top = body.get("top_logprobs")
    if top is not None:
        if top < 0 and top != -1:
            raise BodyProblem("`top_logprobs` must be a positive value or -1.", "top_logprobs")
        if (top == -1 or top > 0) and not body.get("logprobs"):
            raise BodyProblem(
                "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
            )


def _tool_usage(body: dict[str, Any]) -> None:
    """vLLM's `check_tool_usage`, up to the named tool's existence."""
    tools = body.get("tools")
    if tools == []:
        raise BodyProblem(
            "`tools` must not be an empty array. Either provide at least one tool or omit "
            "the field entirely.",
            "tools",
        )
    choice = body.get("tool_choice", "auto" if tools else None)
    if choice is None or choice == "none":
        return
    if tools is None:
        raise BodyProblem("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise BodyProblem(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" '
            'or "required" are supported.',
            "tool_choice",
        )
    if isinstance(choice, dict):
        function = choice.get("function")
        if not isinstance(function, dict):
            raise BodyProblem(
                f"Invalid value for `function`: `{function}` in `tool_choice`!",
                "tool_choice.function",
            )
        if "name" not in function:
            raise BodyProblem(
                "Expected field `name` in `function` in `tool_choice`!",
                "tool_choice.function.name",
            )


def _verify_sampling(req: Any, max_tokens: int | None, logprobs: int | None) -> None:
    """`SamplingParams._verify_args` on the values vLLM builds from the request (unset
    fields take vLLM's defaults: temperature 1, top_p 1, top_k 0, min_p 0, penalties 0/1)."""
    n = 1 if req.n is None else req.n
    if n < 1:
        raise BodyProblem(f"n must be at least 1, got {n}.", None)
    if n > _MAX_N_SEQUENCES:
        raise BodyProblem(f"n must be at most {_MAX_N_SEQUENCES}, got {n}.", None)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value is not None and not -2.0 <= value <= 2.0:
            raise BodyProblem(f"{name} must be in [-2, 2], got {value}.", None)
    _verify_ranges(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
    )
    if logprobs is not None and logprobs != -1 and logprobs < 0:
        raise BodyProblem(f"logprobs must be non-negative or -1, got {logprobs}.", "logprobs")
    if req.prompt_logprobs is not None and req.prompt_logprobs < -1:
        raise BodyProblem(
            f"prompt_logprobs must be non-negative or -1, got {req.prompt_logprobs}.",
            "prompt_logprobs",
        )
    stop = [req.stop] if isinstance(req.stop, str) else req.stop or []
    if any(not s for s in stop):
        raise BodyProblem("stop cannot contain an empty string.", None)
    if any(not w for w in req.bad_words):
        raise BodyProblem(f"bad_words cannot contain an empty string. Got {req.bad_words}", None)
    temperature = 1.0 if req.temperature is None else req.temperature
    if temperature < 1e-5 and n > 1:
        raise BodyProblem(f"n must be 1 when using greedy sampling, got {n}.", None)
    _max_logprobs(req.prompt_logprobs, "prompt_logprobs")
    _logit_bias(req.logit_bias)
    _extra_args(req.vllm_xargs)
    if req.truncate_prompt_tokens == 0:  # truncated to nothing
        raise BodyProblem("The decoder prompt cannot be empty", None)


def _max_logprobs(value: int | None, name: str) -> None:
    """vLLM's serving check: more than --max-logprobs (or -1, the whole vocabulary) is a 400."""
    if value is not None and (value == -1 or value > _MAX_LOGPROBS):
        asked = "the whole vocabulary" if value == -1 else value
        raise BodyProblem(
            f"Requested sample logprobs of {asked}, which is greater than max allowed: "
            f"{_MAX_LOGPROBS}",
            name,
        )


def _logit_bias(bias: dict[str, float] | None) -> None:
    bad = [k for k in bias or () if not _is_int_text(k)]
    if bad:
        raise BodyProblem(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: {bad}",
            "logit_bias",
        )


def _is_int_text(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _extra_args(xargs: Any) -> None:
    """vLLM's `_verify_extra_args`: its transport carries 64-bit integers only."""
    pending = [xargs]
    while pending:
        value = pending.pop()
        if isinstance(value, int) and not -(2**63) <= value < 2**64:
            raise BodyProblem(
                "extra_args integers must be between -2**63 and 2**64 - 1.", "extra_args"
            )
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)


def _verify_ranges(
    *,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    min_p: float | None,
    repetition_penalty: float | None,
    max_tokens: int | None,
    min_tokens: int,
) -> None:
    if repetition_penalty is not None:
        if not math.isfinite(repetition_penalty):
            raise BodyProblem(
                f"repetition_penalty must be a finite number, got {repetition_penalty}.", None
            )
        if repetition_penalty <= 0.0:
            raise BodyProblem(
                f"repetition_penalty must be greater than zero, got {repetition_penalty}.", None
            )
    if temperature is not None:
        if not math.isfinite(temperature):
            raise BodyProblem(
                f"temperature must be a finite number, got {temperature}.", "temperature"
            )
        if temperature < 0.0:
            raise BodyProblem(
                f"temperature must be non-negative, got {temperature}.", "temperature"
            )
        if temperature > 2.0:
            raise BodyProblem(f"temperature must be in [0, 2], got {temperature}.", "temperature")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise BodyProblem(f"top_p must be in (0, 1], got {top_p}.", "top_p")
    if top_k is not None and top_k < -1:
        raise BodyProblem(f"top_k must be 0 (disable), or at least 1, got {top_k}.", None)
    if min_p is not None and not 0.0 <= min_p <= 1.0:
        raise BodyProblem(f"min_p must be in [0, 1], got {min_p}.", None)
    if max_tokens is not None and max_tokens < 1:
        raise BodyProblem(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    if min_tokens < 0:
        raise BodyProblem(f"min_tokens must be greater than or equal to 0, got {min_tokens}.", None)
    if max_tokens is not None and min_tokens > max_tokens:
        raise BodyProblem(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
            None,
        )


def _accepted(req: Any, max_tokens: int | None) -> Accepted:
    options = req.stream_options
    return Accepted(
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        stream=bool(req.stream),
        include_usage=bool(options and options.include_usage),
    )
