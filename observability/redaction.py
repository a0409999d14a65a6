"""Keeps credentials out of log lines: the configured secrets, Authorization values, URL
passwords and `?token=` query values are replaced by `***` before any handler writes a record.

The gateway itself never logs a header, but uvicorn's access log writes request targets (the
dashboard's `?token=` among them) and library errors may quote a URL with its userinfo; this
filter is the one place that guarantees none of it reaches a log file.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from thunder_mw.schemas.config import ThunderConfig

__all__ = ["MASK", "SecretRedactor", "config_secrets", "install", "redact"]

MASK = "***"
_PATTERNS = (
    # `Authorization: Bearer sk-...`, `authorization=...`, `"authorization": "..."`
    re.compile(
        r"(?i)(\b(?:proxy-)?authorization\b[\"']?\s*[:=]\s*[\"']?(?:bearer\s+|basic\s+)?)"
        r"[^\s\"',;]+"
    ),
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]+"),
    # Credentials in a query string: the dashboard's ?token=, ?api_key=, ...
    re.compile(r"(?i)([?&](?:token|access_token|api_key|apikey|key|password)=)[^&\s\"']+"),
    # scheme://user:password@host
    re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)[^/\s@]+(@)"),
)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret and every credential-shaped value masked."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(
            lambda m: m.group(1) + MASK + (m.group(2) if m.re.groups > 1 else ""), text
        )
    return text


def config_secrets(config: ThunderConfig) -> list[str]:
    """The secret values a config holds (admin token, engines' API keys, the state store's
    Redis password)."""
    values = [config.server.admin_token] + [b.api_key for b in config.backends]
    secrets = [v.get_secret_value() for v in values if v is not None and v.get_secret_value()]
    return secrets + config.state.secrets()


class SecretRedactor(logging.Filter):
    """A handler filter (handler, not logger: records propagated from child loggers pass a
    handler's filters but not their ancestors' logger filters)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # Longest first, so a secret containing another is masked whole.
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg, self.secrets)
        if isinstance(record.args, tuple):
            # Arguments are masked one by one, keeping the tuple: uvicorn's access formatter
            # unpacks it.
            record.args = tuple(self._arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: self._arg(v) for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(
                logging.Formatter().formatException(record.exc_info), self.secrets
            )
        elif record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        fields = getattr(record, "thunder", None)
        if isinstance(fields, dict):
            record.thunder = {k: self._arg(v) for k, v in fields.items()}
        return True

    def _arg(self, value: Any) -> Any:
        if isinstance(value, int | float | bool) or value is None:
            return value
        text = value if isinstance(value, str) else str(value)
        masked = redact(text, self.secrets)
        return value if masked == text else masked


def install(
    secrets: Iterable[str],
    loggers: Iterable[str] = ("", "uvicorn", "uvicorn.error", "uvicorn.access"),
) -> SecretRedactor:
    """Adds one redactor to every handler of the root and uvicorn loggers (after uvicorn has
    configured its own)."""
    redactor = SecretRedactor(secrets)
    for name in loggers:
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, SecretRedactor) for f in handler.filters):
                handler.addFilter(redactor)
    return redactor
