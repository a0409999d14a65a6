"""thunder_mw.cli"""
