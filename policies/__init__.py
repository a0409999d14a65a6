"""thunder_mw.policies"""
