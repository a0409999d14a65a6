"""The shipped nginx config for replicas is the one docs/replicas.md shows, and its header
chain names the headers thunder-mw reads."""

from __future__ import annotations

import re
from pathlib import Path

from thunder_mw.schemas import context_parsing

ROOT = Path(__file__).resolve().parents[2]
CONF = (ROOT / "config" / "nginx-replicas.conf").read_text()


def test_every_line_of_the_documented_nginx_excerpt_is_in_the_shipped_file() -> None:
    doc = (ROOT / "docs" / "replicas.md").read_text()
    block = re.search(r"```nginx\n(.*?)```", doc, re.S)
    assert block is not None
    shipped = {line.strip() for line in CONF.splitlines()}
    missing = [ln.strip() for ln in block.group(1).splitlines() if ln.strip() not in shipped]
    assert missing == []


def test_nginx_hashes_on_the_program_headers_thunder_mw_reads() -> None:
    hashed = set(re.findall(r"\$http_([a-z0-9_]+)", CONF))
    names = {
        context_parsing.H_DYNAMO_SESSION,
        context_parsing.H_DYNAMO_TRAJECTORY,
        context_parsing.H_LITELLM_SESSION,
        context_parsing.H_OPENCODE_SESSION,
        context_parsing.H_CLAUDE_SESSION,
    }
    assert {n.decode().replace("-", "_") for n in names} == hashed
