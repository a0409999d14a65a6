"""Which KV block classes the simulator runs: the compiled ones (sim/_kvblocks.c) where they
were built, else the Python ones they are checked against (sim/kv_cache.BlockPoolPy,
sim/kv_tier.KvTierPy). Both give the same results call by call
(tests/sim/test_sim_kv_native.py); the compiled ones are many times faster.

THUNDER_MW_SIM_PYTHON_BLOCKS=1 runs the Python ones even where the compiled ones exist (to
time or check one against the other on a whole run).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

__all__ = ["PYTHON_BLOCKS_ENV", "native_module", "pick"]

PYTHON_BLOCKS_ENV = "THUNDER_MW_SIM_PYTHON_BLOCKS"


def native_module() -> ModuleType | None:
    """The compiled module, or None (not built here, or the Python classes asked for)."""
    if os.environ.get(PYTHON_BLOCKS_ENV, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("thunder_mw.sim._kvblocks")
    except ImportError:
        return None


def pick(python_class: type[Any], name: str) -> type[Any]:
    """The class named `name` to run: a subclass of the compiled one (a Python class, so
    lab/block_replay.py can wrap its methods) or `python_class` itself."""
    native = native_module()
    if native is None:
        return python_class
    return type(
        name,
        (getattr(native, name),),
        {"__slots__": (), "__doc__": python_class.__doc__, "__module__": python_class.__module__},
    )
