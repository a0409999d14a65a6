"""thunder_mw.middleware"""
