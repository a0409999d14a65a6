"""thunder_mw.observability"""

__all__: list[str] = []
