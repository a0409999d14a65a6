"""thunder-mw: a program-aware scheduling gateway for LLM agents.

Gateway mode needs only the names exported here: `ThunderMiddleware` wraps your ASGI app,
`load_config` reads the YAML, `call_state(scope)` tells your app which engine the scheduler
chose (`.backend_url`) and for which program (`.context`), and `report_usage` hands the
call's tokens back. They are imported on first use, so `import thunder_mw` stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from thunder_mw._version import __version__

_EXPORTS = {
    "ThunderMiddleware": "thunder_mw.middleware.app",
    "create_app": "thunder_mw.middleware.app",
    "load_config": "thunder_mw.cli.config_loader",
    "call_state": "thunder_mw.middleware.call_state",
    "report_usage": "thunder_mw.middleware.call_state",
}
__all__ = [
    "ThunderMiddleware",
    "__version__",
    "call_state",
    "create_app",
    "load_config",
    "report_usage",
]

if TYPE_CHECKING:
    from thunder_mw.cli.config_loader import load_config
    from thunder_mw.middleware.app import ThunderMiddleware, create_app
    from thunder_mw.middleware.call_state import call_state, report_usage


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'thunder_mw' has no attribute {name!r}")
    return getattr(import_module(module), name)
