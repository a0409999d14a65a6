"""thunder_mw.schemas"""

__all__: list[str] = []
