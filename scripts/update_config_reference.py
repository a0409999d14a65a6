"""Rewrites the generated table of docs/configuration.md from `thunder-mw config-reference`.

Usage: python scripts/update_config_reference.py [--check]   (--check: exit 1 if stale)
"""

import re
import sys
from pathlib import Path

from thunder_mw.schemas.config_reference import config_reference

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BLOCK = re.compile(r"(<!-- config-reference:start -->\n).*?(<!-- config-reference:end -->)", re.S)

text = REFERENCE.read_text()
if BLOCK.search(text) is None:
    sys.exit(f"{REFERENCE}: no <!-- config-reference:start/end --> block")
new = BLOCK.sub(lambda m: m.group(1) + config_reference() + m.group(2), text)
if "--check" in sys.argv:
    sys.exit(0 if new == text else 1)
REFERENCE.write_text(new)
