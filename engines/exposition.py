"""An engine's Prometheus page, read with prometheus_client's own text parser.

One reader for the pool's live signals (engines/pool.py) and the capacity the page reports
(engines/capacity.py), as the benchmarks and tests read it, instead of hand-written regexes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(slots=True)
class Exposition:
    """Each sample's value summed over its label sets (the engines label by model and
    engine index), and the label sets of the `*_info` series."""

    totals: dict[str, float] = field(default_factory=dict)
    info: dict[str, list[dict[str, str]]] = field(default_factory=dict)


def read_exposition(text: bytes) -> Exposition:
    """Raises ValueError for a page that is not Prometheus text."""
    page = Exposition()
    for family in text_string_to_metric_families(text.decode("utf-8", "replace")):
        for sample in family.samples:
            page.totals[sample.name] = page.totals.get(sample.name, 0.0) + sample.value
            if sample.name.endswith("_info"):
                page.info.setdefault(sample.name, []).append(dict(sample.labels))
    return page
