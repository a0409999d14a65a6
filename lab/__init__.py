"""One-off measurements run from a checkout (`python -m thunder_mw.lab.NAME`), each writing a
committed file under results/: not part of the wheel (pyproject.toml lists the packages it
ships), and never imported by the package; what `thunder-mw bench` and `replay` run lives in
benchmarks/."""

__all__: list[str] = []
