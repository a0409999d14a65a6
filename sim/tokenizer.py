"""Deterministic tokenisation for the simulated engine: a fixed rule, or a real tokenizer file."""

from __future__ import annotations

import re
import zlib
from typing import Protocol

__all__ = ["FILLER_TEXT", "FileTokenizer", "RuleTokenizer", "Tokenizer", "load_tokenizer"]

# About four characters per token, like common BPE vocabularies on English text and code.
_PIECE = re.compile(r" ?[A-Za-z0-9_]{1,4}| ?[^\sA-Za-z0-9_]|\s+")
_FIRST_WORD_ID = 1000
_WORD_ID_SPACE = 100_000

FILLER_TEXT = (
    " The agent considers the tool result and plans the next step carefully before it"
    " writes the answer in a short and plain form for the user to read."
)


class Tokenizer(Protocol):
    """What the engine needs from a tokenizer: ids for a text, and text for ids."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    @property
    def filler_ids(self) -> list[int]: ...


class RuleTokenizer:
    """Splits text into pieces of at most four word characters (a space joins the piece after it).

    Ids come from a CRC of the piece, so the same text always gives the same ids in every
    process; no vocabulary file is needed.
    """

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._pieces: dict[int, str] = {}
        self._filler = self.encode(FILLER_TEXT)

    def encode(self, text: str) -> list[int]:
        ids = self._ids
        out: list[int] = []
        append = out.append
        for piece in _PIECE.findall(text):
            tid = ids.get(piece)
            if tid is None:
                tid = _FIRST_WORD_ID + zlib.crc32(piece.encode()) % _WORD_ID_SPACE
                ids[piece] = tid
                self._pieces.setdefault(tid, piece)
            append(tid)
        return out

    def decode(self, ids: list[int]) -> str:
        pieces = self._pieces
        return "".join(pieces.get(i, " ?") for i in ids)

    @property
    def filler_ids(self) -> list[int]:
        return self._filler


class FileTokenizer:
    """A Hugging Face `tokenizers` file, so token counts equal the real engine's for that model."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer as HFTokenizer  # optional dependency (test extra)

        self._tok = HFTokenizer.from_file(path)
        self._filler = self._tok.encode(FILLER_TEXT, add_special_tokens=False).ids

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    @property
    def filler_ids(self) -> list[int]:
        return self._filler

    @property
    def vocab_size(self) -> int:
        """Token ids at or past this are refused, as vLLM refuses them ("out of vocabulary")."""
        return int(self._tok.get_vocab_size())


def load_tokenizer(path: str | None) -> Tokenizer:
    """The file tokenizer when a path is given, the rule tokenizer otherwise."""
    return FileTokenizer(path) if path else RuleTokenizer()
