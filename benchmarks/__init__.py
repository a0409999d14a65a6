"""thunder_mw.benchmarks"""
