"""Which client key owns which program: the first key to use a program id keeps it until release.

Pure bookkeeping, no I/O: the middleware hands in opaque key digests (never the keys
themselves) and drops a program's binding when the scheduler releases the program.
"""

from __future__ import annotations

import enum
import hmac

__all__ = ["Claim", "ProgramOwners"]


class Claim(enum.Enum):
    BOUND = "bound"  # the program had no owner; it is this key's now
    OWNER = "owner"  # the program is already this key's
    REFUSED = "refused"  # another key owns the program


class ProgramOwners:
    """Bindings of live program ids to owner digests; one per live program at most."""

    def __init__(self) -> None:
        self._owner: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self._owner)

    def claim(self, program_id: str, digest: bytes) -> Claim:
        """Bind an unowned program to `digest`, or say whether `digest` already owns it."""
        owner = self._owner.get(program_id)
        if owner is None:
            self._owner[program_id] = digest
            return Claim.BOUND
        return Claim.OWNER if hmac.compare_digest(owner, digest) else Claim.REFUSED

    def permits(self, program_id: str, digest: bytes | None) -> bool:
        """May the holder of `digest` act on the program (release it, hand it sandboxes)?
        An unowned program is anyone's; an owned one only its owner's."""
        owner = self._owner.get(program_id)
        return owner is None or (digest is not None and hmac.compare_digest(owner, digest))

    def forget(self, program_id: str) -> None:
        self._owner.pop(program_id, None)

    def owner_of(self, program_id: str) -> bytes | None:
        return self._owner.get(program_id)

    def bind(self, program_id: str, digest: bytes) -> None:
        """Set the owner as another gateway replica bound it first (docs/replicas.md)."""
        self._owner[program_id] = digest
