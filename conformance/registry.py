"""The conformance checks a profile holds (_catalogue.py has the profiles and the checks'
catalogue; importing this module imports every check module, which register themselves)."""

from __future__ import annotations

# Imported for their registrations: every check is in CHECKS before anyone reads it.
from thunder_mw.conformance import _checks_context, _checks_payload, _checks_programs  # noqa: F401
from thunder_mw.conformance._catalogue import (
    CHECKS,
    PEER_CONTRACTS,
    PROFILE_MEANING,
    PROFILES,
    Check,
    CheckBody,
)

__all__ = [
    "CHECKS",
    "PEER_CONTRACTS",
    "PROFILES",
    "PROFILE_MEANING",
    "Check",
    "CheckBody",
    "checks_for",
]


def checks_for(profile: str) -> list[Check]:
    """The profile's checks in catalogue order."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    contract = PEER_CONTRACTS.get(profile)
    if contract is not None:
        unknown = contract - set(CHECKS)
        if unknown:
            raise ValueError(f"profile {profile} names unknown checks {sorted(unknown)}")
        return [c for c in CHECKS.values() if c.id in contract]
    return [c for c in CHECKS.values() if profile in c.profiles]
