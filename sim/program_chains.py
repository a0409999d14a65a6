"""Each program's latest request across a fleet of simulated engines, for its next request's
block hash chain to start from (`Engine._reuse_hashes`).

A chain is a function of the tokens and the block size alone, so an engine a program moved
to can take it over from the engine it left rather than hash the whole context again: on a
fleet whose scheduler moves programs, most of the hashing was of contexts another engine had
hashed already.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["ProgramChains"]

# A request as the engine keeps it (sim/engine.py's `Sequence`): held here, never read, so
# this module needs nothing of the engine that imports it.
Request = TypeVar("Request")


class ProgramChains(Generic[Request]):
    """Program id -> its latest request on any engine sharing this, oldest dropped past
    `limit`. The engines must hash alike: same block size, same output (filler) tokens."""

    __slots__ = ("_latest", "block_size", "filler_ids", "limit")

    def __init__(self, block_size: int, filler_ids: list[int], limit: int) -> None:
        self.block_size = block_size
        self.filler_ids = list(filler_ids or [0])
        self.limit = limit
        self._latest: dict[str, Request] = {}

    def swap(self, program_id: str, seq: Request) -> Request | None:
        """The program's latest request (None: none remembered); `seq` is it from now on."""
        latest = self._latest
        prev = latest.pop(program_id, None)
        latest[program_id] = seq
        if len(latest) > self.limit:
            del latest[next(iter(latest))]
        return prev
