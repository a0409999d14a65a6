"""What is resident: correct the scheduler's own accounting with the engine's KV gauge.

The scheduler reserves, for a program with a call in the engine, its context plus the whole
output it may write plus a growth buffer; the engine holds only what was computed so far. So
its reservations run ahead of the engine: the README's dashboard shows 94 % reserved on an
engine reporting 48 % in use. The engine's gauge (vLLM `kv_cache_usage_perc`, SGLang
`token_usage`) counts exactly the blocks running requests hold (cached blocks no request
holds count as free), so over the running programs

    rho = clamp(kv_usage * capacity / running_reserved, floor, 1)

is the share of their reservation actually resident, smoothed over scrapes. Admission and
pausing then plan with `reserved - (1 - rho) * running_reserved`. Bounded: rho never
inflates a reservation (the preemption back-off does that) and never credits more than
`1 - floor` of it back, so one odd scrape cannot flood an engine. Pure: no clock needed.
"""

from __future__ import annotations

from thunder_mw.policies.estimates import ema

__all__ = ["MIN_RUNNING_TOKENS", "RESIDENT_EMA_ALPHA", "resident_ratio"]

RESIDENT_EMA_ALPHA = 0.3
# Too few reserved tokens say nothing about a ratio (an engine between calls).
MIN_RUNNING_TOKENS = 1024


def resident_ratio(
    previous: float,
    kv_usage: float | None,
    capacity: int | None,
    running_reserved: int,
    floor: float,
) -> float:
    """The smoothed share of the running programs' reservation the engine holds."""
    if kv_usage is None or not capacity or running_reserved < MIN_RUNNING_TOKENS:
        return previous
    sample = min(1.0, max(floor, kv_usage * capacity / running_reserved))
    return max(floor, min(1.0, ema(previous, sample, RESIDENT_EMA_ALPHA)))
