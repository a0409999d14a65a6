"""thunder_mw.observability"""
