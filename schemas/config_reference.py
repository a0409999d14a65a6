"""Renders docs/configuration.md's key table from the Field descriptions check-config uses."""

from __future__ import annotations

import enum
import json
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from thunder_mw.schemas.config import ThunderConfig
from thunder_mw.schemas.stage_settings import STAGE_SETTINGS

__all__ = ["config_reference"]


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "(required)"
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, list):
        value = [v.value if isinstance(v, enum.Enum) else v for v in value]
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{json.dumps(value)}`"


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = field.annotation
        nested = _nested_model(annotation)
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        if nested is not None and not _is_list(annotation):
            rows.append(f"| `{key}` | (section) | {description} |")
            rows.extend(_rows(nested, f"{key}."))
        elif nested is not None:
            rows.append(f"| `{key}` | `[]` | {description} |")
            rows.extend(_rows(nested, f"{key}[]."))
        else:
            rows.append(f"| `{key}` | {_default(field)} | {description} |")
        if model is ThunderConfig and name == "policies":
            rows.extend(_stage_rows(f"{key}[]."))
    return rows


def _stage_rows(prefix: str) -> list[str]:
    """Each built-in stage's params, at the defaults an entry that leaves them out gets."""
    rows: list[str] = []
    for stage, setting in STAGE_SETTINGS.items():
        params = _nested_model(setting.model_fields[stage].annotation)
        if params is not None and params.model_fields:
            rows.extend(_rows(params, f"{prefix}{stage}."))
    return rows


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _is_list(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is list


def config_reference() -> str:
    """A markdown table of every config key, its default and its meaning."""
    header = ["| key | default | meaning |", "|---|---|---|"]
    return "\n".join(header + _rows(ThunderConfig, "")) + "\n"
