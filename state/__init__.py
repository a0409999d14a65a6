"""The shared state of several gateway replicas (docs/replicas.md): an I/O component under
the live scheduler."""

__all__: list[str] = []
