"""An engine's Prometheus page, read with prometheus_client's own text parser.

One reader for the pool's live signals (engines/pool.py) and the capacity the page reports
(engines/capacity.py), as the benchmarks and tests read it, instead of hand-written regexes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Exposition", "read_exposition"]


@dataclass(slots=True)
class Exposition:
    """Each sample's value summed over its label sets (the engines label by model and
    engine index), and the label sets of the `*_info` series."""

    totals: dict[str, float] = field(default_factory=dict)
    info: dict[str, list[dict[str, str]]] = field(default_factory=dict)


def read_exposition(text: bytes, names: frozenset[str] | None = None) -> Exposition:
    """Raises ValueError for a page that is not Prometheus text. `names`: only the samples of
    these names are read (every other line is dropped before parsing). vLLM's page is ~600
    lines of histograms and the gateway wants about a dozen samples from it: parsing it
    whole took 7.5-11 ms of the gateway's CPU per read, holding the GIL its event loop needs."""
    if names is not None:
        kept = _lines_named(text, names)
        # A page with none of them is parsed whole, so a page that is not Prometheus text
        # still raises (the caller then keeps no signals) rather than reading as empty.
        text = kept if kept else text
    page = Exposition()
    for family in text_string_to_metric_families(text.decode("utf-8", "replace")):
        for sample in family.samples:
            page.totals[sample.name] = page.totals.get(sample.name, 0.0) + sample.value
            if sample.name.endswith("_info"):
                page.info.setdefault(sample.name, []).append(dict(sample.labels))
    return page


def _lines_named(text: bytes, names: frozenset[str]) -> bytes:
    """The sample lines of `text` whose sample name is one of `names` (comments dropped: the
    samples' names do not depend on the families' TYPE lines)."""
    wanted = {n.encode() for n in names}
    kept = []
    for line in text.splitlines():
        if line[:1] in (b"#", b""):
            continue
        end = len(line)
        for stop in (b"{", b" "):
            at = line.find(stop)
            if 0 <= at < end:
                end = at
        if line[:end] in wanted:
            kept.append(line)
    return b"\n".join(kept) + b"\n" if kept else b""
