"""thunder_mw.tools"""
