"""Rewrites README's config reference block from `thunder-mw config-reference`."""

import re
import sys
from pathlib import Path

from thunder_mw.schemas.config_reference import config_reference

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"(<!-- config-reference:start -->\n).*?(<!-- config-reference:end -->)", re.S)

text = README.read_text()
new = BLOCK.sub(lambda m: m.group(1) + config_reference() + m.group(2), text)
if "--check" in sys.argv:
    sys.exit(0 if new == text else 1)
README.write_text(new)
