"""`program_owner: header`: a program id belongs to the API key that first used it.

Without it any client that learns (or guesses) another's program id could ride on its KV
placement, attach containers to it or release it. Keys are never stored: a program is bound
to an HMAC of the header's value under a key made at start-up, so neither the table nor any
log holds a credential, and bindings end with the program (release, final step, expiry).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from thunder_mw.policies.core import Action, Released
from thunder_mw.policies.program_owners import Claim, ProgramOwners

__all__ = ["Headers", "OwnerRefusal", "ProgramOwnership"]

Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class OwnerRefusal:
    """Why a request may not use a program: answered as an OpenAI-style error."""

    status: int
    message: str
    param: str
    code: str


class ProgramOwnership:
    def __init__(self, header: str, digest_key: bytes | None = None) -> None:
        self.header = header.lower()
        self._header = self.header.encode("latin-1")
        self._key = digest_key or secrets.token_bytes(32)
        self.owners = ProgramOwners()

    def digest(self, headers: Headers) -> bytes | None:
        """The keyed digest of the owner header's (first) value; None when it is absent."""
        for name, value in headers:
            if name == self._header:
                return hmac.new(self._key, value, hashlib.sha256).digest()
        return None

    def claim(self, program_id: str, headers: Headers) -> Claim | OwnerRefusal:
        """Bind an unowned program to this request's key, or refuse a request that is not
        its owner's. Synchronous, so no other request can claim the id in between."""
        digest = self.digest(headers)
        if digest is None:
            if self.owners.permits(program_id, None):
                return OwnerRefusal(
                    401,
                    f"this gateway binds programs to the `{self.header}` header; send it",
                    self.header,
                    "owner_key_required",
                )
            return self._refused(program_id)
        claim = self.owners.claim(program_id, digest)
        return self._refused(program_id) if claim is Claim.REFUSED else claim

    def check(self, program_id: str, headers: Headers) -> OwnerRefusal | None:
        """For acting on a program without using it (release, sandboxes): binds nothing."""
        if self.owners.permits(program_id, self.digest(headers)):
            return None
        return self._refused(program_id)

    def forget(self, program_id: str) -> None:
        self.owners.forget(program_id)

    def use_key(self, digest_key: bytes) -> None:
        """Replicas sharing a Redis digest keys with one shared key, so a binding made on one
        holds on every other (set before the first request)."""
        self._key = digest_key

    def on_action(self, action: Action) -> None:
        """Scheduler listener: a released program's id is free for the next client."""
        if isinstance(action, Released):
            self.owners.forget(action.program_id)

    @staticmethod
    def _refused(program_id: str) -> OwnerRefusal:
        return OwnerRefusal(
            403,
            f"program {program_id!r} belongs to another API key",
            "program_id",
            "program_owned_by_another_key",
        )
