"""thunder_mw.schemas"""
