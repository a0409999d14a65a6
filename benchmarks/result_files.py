"""Where benchmark results go: `results` under the current directory, by default.

Relative to the working directory, not to this file: run from the repository root, a harness
writes where results are committed; installed, it never writes into site-packages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["RESULTS_DIR", "write_result"]

RESULTS_DIR = Path("results")


def write_result(path: Path, report: dict[str, Any], *, indent: int = 2) -> None:
    """Writes `report` as JSON to `path`, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=indent) + "\n")
