"""The engine simulator: a vLLM/SGLang stand-in with paged KV, prefix caching and preemption."""

__all__: list[str] = []
