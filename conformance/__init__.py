"""thunder_mw.conformance"""
