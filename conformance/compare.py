"""Strict JSON value comparison: what "forwarded unchanged" means to the conformance suite.

Python's `==` says `1 == 1.0 == True` and ignores key order; a proxy that turns an int into a
float or sorts keys has changed the request, so this comparison tells them apart and names
the first place where two documents differ.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["first_difference"]


def first_difference(
    expected: Any, actual: Any, *, ordered: bool = True, path: str = "$"
) -> str | None:
    """None when equal; otherwise where and how `actual` differs from `expected`.

    `ordered=False` ignores the order of object keys (not of array items)."""
    if type(expected) is not type(actual):
        return (
            f"{path}: expected {type(expected).__name__} {_short(expected)}, "
            f"got {type(actual).__name__} {_short(actual)}"
        )
    if isinstance(expected, dict):
        missing = [k for k in expected if k not in actual]
        if missing:
            return f"{path}: key {missing[0]!r} is missing"
        extra = [k for k in actual if k not in expected]
        if extra:
            return f"{path}: unexpected key {extra[0]!r} = {_short(actual[extra[0]])}"
        if ordered and list(expected) != list(actual):
            return f"{path}: key order changed: expected {list(expected)}, got {list(actual)}"
        for key, value in expected.items():
            diff = first_difference(value, actual[key], ordered=ordered, path=f"{path}.{key}")
            if diff:
                return diff
        return None
    if isinstance(expected, list):
        if len(expected) != len(actual):
            return f"{path}: expected {len(expected)} items, got {len(actual)}"
        for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
            diff = first_difference(a, b, ordered=ordered, path=f"{path}[{i}]")
            if diff:
                return diff
        return None
    if isinstance(expected, float):
        same = expected == actual and math.copysign(1, expected) == math.copysign(1, actual)
        if not same and not (math.isnan(expected) and math.isnan(actual)):
            return f"{path}: expected {expected!r}, got {actual!r}"
        return None
    if expected != actual:
        return f"{path}: expected {_short(expected)}, got {_short(actual)}"
    return None


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
