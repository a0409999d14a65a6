"""The agent-context conformance suite: what a server accepts, strips, rejects and forwards."""

__all__: list[str] = []
