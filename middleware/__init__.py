"""thunder_mw.middleware"""

__all__: list[str] = []
