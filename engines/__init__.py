"""thunder_mw.engines"""

__all__: list[str] = []
