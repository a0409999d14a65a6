"""thunder_mw.benchmarks"""

__all__: list[str] = []
