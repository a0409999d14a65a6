"""thunder_mw.cli"""

__all__: list[str] = []
