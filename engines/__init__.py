"""thunder_mw.engines"""
