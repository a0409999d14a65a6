"""How the gateway's log lines look: plain text, or one JSON object per line for log shippers."""

from __future__ import annotations

import json
import logging
from typing import Any

__all__ = ["TEXT_FORMAT", "JsonFormatter", "configure_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; the structured fields a record carries under `thunder`
    (decision logs: decision, program_id, backend, reason) become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "thunder", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info or record.exc_text:
            # exc_text first: a filter (observability/redaction.py) may have masked it.
            out["exception"] = record.exc_text or (
                self.formatException(record.exc_info) if record.exc_info else None
            )
        return json.dumps(out, default=str)


def configure_logging(level: str, log_format: str) -> None:
    """The root handler for `thunder-mw serve` (library users keep their own logging)."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
