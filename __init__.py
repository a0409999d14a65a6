"""thunder-mw: a program-aware scheduling gateway for LLM agents."""

__version__ = "0.1.0"
