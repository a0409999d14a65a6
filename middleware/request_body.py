"""The decoded request body, shared by one request's layers so it is parsed and encoded once."""

from __future__ import annotations

from typing import Any

import msgspec

_encode = msgspec.json.Encoder().encode


class RequestBody:
    """A JSON object body: `data` is the decoded dict; `raw` the bytes it came as.

    Layers that change `data` call `changed()`; `encoded()` then re-encodes once, keeping
    every other key's value and order. `consumed` is set once a layer took the body, so the
    replayed `receive` does not hand it out a second time.
    """

    __slots__ = ("_dirty", "consumed", "data", "raw")

    def __init__(self, data: dict[str, Any], raw: bytes) -> None:
        self.data = data
        self.raw = raw
        self._dirty = False
        self.consumed = False

    def changed(self) -> None:
        self._dirty = True

    def encoded(self) -> bytes:
        if self._dirty:
            self.raw = _encode(self.data)
            self._dirty = False
        return self.raw
