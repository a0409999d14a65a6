"""The installed distribution's version, in a module of its own so that the layers below the
package root (the app, the composition root, the CLI) read it without importing upward."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("thunder-mw")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
