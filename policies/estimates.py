"""Learned estimates the scheduler plans with: tokens per character, and tool (acting) time."""

from __future__ import annotations

__all__ = [
    "DEFAULT_CHARS_PER_TOKEN",
    "EMA_ALPHA",
    "MAX_SESSION_TYPES",
    "TokenEstimator",
    "ToolTimeModel",
    "ema",
]

DEFAULT_CHARS_PER_TOKEN = 4.0
EMA_ALPHA = 0.3
# Session types are a handful of agent kinds; a client that sends an id there instead must
# not grow the model with every program (past this, new types use the global estimate).
MAX_SESSION_TYPES = 1024


def ema(old: float | None, sample: float, alpha: float = EMA_ALPHA) -> float:
    return sample if old is None else old + alpha * (sample - old)


class TokenEstimator:
    """Turns a request body's size into prompt tokens before the engine has counted them.

    Learned per backend from each answer's `usage.prompt_tokens` (models' tokenizers differ);
    the JSON overhead of a body is part of what is learned, so the ratio stays honest.
    """

    def __init__(self, initial_chars_per_token: float = DEFAULT_CHARS_PER_TOKEN) -> None:
        self.initial = initial_chars_per_token
        self._ratio: dict[str, float] = {}

    def ratio(self, backend: str | None) -> float:
        if backend is None:
            return self.initial
        return self._ratio.get(backend, self.initial)

    def prompt_tokens(self, chars: int, backend: str | None) -> int:
        return int(chars / self.ratio(backend)) + 1

    def learn(self, backend: str, chars: int, prompt_tokens: int) -> None:
        if chars > 0 and prompt_tokens > 0:
            self._ratio[backend] = ema(self._ratio.get(backend), chars / prompt_tokens)


class ToolTimeModel:
    """Expected acting (tool) time: an EMA per program, else per session type, else global.

    Tool times are heavy-tailed (reference/agent-workloads.md): a call that has already run
    past its expectation is likely to run on, so the expected remainder never falls below
    half of the time already spent.
    """

    def __init__(self, default_s: float = 2.0) -> None:
        self.default_s = default_s
        self._by_type: dict[str, float] = {}
        self._global: float | None = None

    def observe(
        self, session_type: str | None, program_ema: float | None, sample_s: float
    ) -> float:
        """Record a finished tool gap; returns the program's new EMA."""
        known = self._by_type.get(session_type) if session_type is not None else None
        if session_type is not None and (
            known is not None or len(self._by_type) < MAX_SESSION_TYPES
        ):
            self._by_type[session_type] = ema(known, sample_s)
        self._global = ema(self._global, sample_s)
        return ema(program_ema, sample_s)

    def expected(self, session_type: str | None, program_ema: float | None) -> float:
        if program_ema is not None:
            return program_ema
        if session_type is not None and session_type in self._by_type:
            return self._by_type[session_type]
        return self._global if self._global is not None else self.default_s

    def remaining(self, expected_s: float, elapsed_s: float) -> float:
        return max(expected_s - elapsed_s, 0.5 * elapsed_s)
