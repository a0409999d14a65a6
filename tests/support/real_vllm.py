"""The real vLLM CPU engine launcher for tests: re-exported from thunder_mw.benchmarks.vllm_cpu.

The launcher lives in the package so `thunder-mw bench --scenario vllm-cpu-real` can start the
same engine the tests use; tests keep importing it from here by its old names.
"""

from __future__ import annotations

from thunder_mw.benchmarks.engine_counters import parse_metrics
from thunder_mw.benchmarks.vllm_cpu import (
    MODEL_DIR,
    MODEL_READY_MARKER,
    ROOT,
    SERVED_MODEL_NAME,
    SETUP_HINT,
    VENV_DIR,
    VENV_READY_MARKER,
    EngineStartError,
    EngineUnavailable,
    RealVllm,
    missing_prerequisites,
    parse_ignored_fields,
    start_vllm,
)

__all__ = [
    "MODEL_DIR",
    "MODEL_READY_MARKER",
    "ROOT",
    "SERVED_MODEL_NAME",
    "SETUP_HINT",
    "VENV_DIR",
    "VENV_READY_MARKER",
    "EngineStartError",
    "EngineUnavailable",
    "RealVllm",
    "missing_prerequisites",
    "parse_ignored_fields",
    "parse_metrics",
    "start_vllm",
]
