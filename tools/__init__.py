"""thunder_mw.tools"""

__all__: list[str] = []
