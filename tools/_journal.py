"""The tool manager's durable memory: who owns which container and which reclaims are pending.

Every change is written (SQLite, WAL, synchronous=FULL) before the gateway acts on it, so a
gateway killed at any point restarts knowing every container it owns or was about to create
or reclaim. All SQLite calls run on one worker thread; the event loop only awaits them.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["STATES", "Entry", "ToolJournal"]

# creating: about to be started under `name` (key "name:<name>"); pool: ready, nobody's;
# owned: a program's; reclaiming: its program ended, the reclaim is under way or pending.
STATES = ("creating", "pool", "owned", "reclaiming")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS containers (
    key TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    program_id TEXT,
    state TEXT NOT NULL,
    template TEXT,
    image_id TEXT,
    hooks TEXT NOT NULL DEFAULT '[]',
    reason TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT
)
"""
_COLUMNS = "key, name, program_id, state, template, image_id, hooks, reason, attempts, last_error"


@dataclass
class Entry:
    """One container the gateway is responsible for (in memory; mirrored in the journal)."""

    key: str  # the full container id, or "name:<name>" while it is being created
    name: str
    program_id: str | None
    state: str
    template: str | None = None
    image_id: str | None = None
    hooks: list[str] = field(default_factory=list)
    reason: str | None = None
    attempts: int = 0
    last_error: str | None = None
    # Not journalled: timers restart with the process.
    unseen_since: float | None = None
    next_attempt_at: float = 0.0
    busy: bool = False

    def row(self) -> tuple[Any, ...]:
        return (
            self.key,
            self.name,
            self.program_id,
            self.state,
            self.template,
            self.image_id,
            json.dumps(self.hooks),
            self.reason,
            self.attempts,
            self.last_error,
        )


class _JournalFile:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        # FULL: a record the gateway acted on survives a power cut, not only a process kill.
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(_SCHEMA)

    def load(self) -> list[Entry]:
        rows = self.db.execute(f"SELECT {_COLUMNS} FROM containers").fetchall()
        return [
            Entry(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7], r[8], r[9])
            for r in rows
        ]

    def put(self, entries: list[Entry]) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany(
                f"INSERT OR REPLACE INTO containers ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [e.row() for e in entries],
            )

    def rekey(self, old_key: str, entry: Entry) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM containers WHERE key = ?", (old_key,))
            self.db.execute(
                f"INSERT OR REPLACE INTO containers ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                entry.row(),
            )

    def delete(self, keys: list[str]) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("DELETE FROM containers WHERE key = ?", [(k,) for k in keys])

    def close(self) -> None:
        self.db.close()


class ToolJournal:
    """Async face of the journal file; one thread, so writes keep their order."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="thunder-mw-journal")
        self._file: _JournalFile | None = None

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def open(self) -> list[Entry]:
        self._file = await self._run(_JournalFile, self.path)
        entries: list[Entry] = await self._run(self._file.load)
        return entries

    async def put(self, *entries: Entry) -> None:
        assert self._file is not None
        await self._run(self._file.put, list(entries))

    async def rekey(self, old_key: str, entry: Entry) -> None:
        assert self._file is not None
        await self._run(self._file.rekey, old_key, entry)

    async def delete(self, *keys: str) -> None:
        assert self._file is not None
        await self._run(self._file.delete, list(keys))

    async def close(self) -> None:
        if self._file is not None:
            await self._run(self._file.close)
            self._file = None
        self._thread.shutdown(wait=False)
