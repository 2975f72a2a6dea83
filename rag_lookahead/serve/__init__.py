"""This engine behind an OpenAI-compatible HTTP server (``rag-lookahead serve --backend local``).

`create_app` builds a FastAPI app over one engine; `StartingApp` serves one while it is being
built (``/health`` 503 with the start-up's stage until ready); `ServeSettings` says how it serves. The
app needs the ``serve`` extra (FastAPI, uvicorn, sse-starlette, prometheus-client), imported
only when `create_app` (or `ApiError`, `ServerState`) is first asked for: `ServeSettings` and
the command line's help need none of them. Nothing in the core imports this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rag_lookahead.serve.settings import ServeSettings

if TYPE_CHECKING:
    from rag_lookahead.serve.app import ServerState, create_app
    from rag_lookahead.serve.errors import ApiError
    from rag_lookahead.serve.run import DrainingServer, run_app
    from rag_lookahead.serve.startup import StartingApp, StartupStages

__all__ = [
    "ApiError",
    "DrainingServer",
    "ServeSettings",
    "ServerState",
    "StartingApp",
    "StartupStages",
    "create_app",
    "run_app",
]

_LAZY = {
    "create_app": "rag_lookahead.serve.app",
    "ServerState": "rag_lookahead.serve.app",
    "ApiError": "rag_lookahead.serve.errors",
    "DrainingServer": "rag_lookahead.serve.run",
    "run_app": "rag_lookahead.serve.run",
    "StartingApp": "rag_lookahead.serve.startup",
    "StartupStages": "rag_lookahead.serve.startup",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'rag_lookahead.serve' has no attribute {name!r}")
    try:
        module = importlib.import_module(_LAZY[name])
    except ImportError as err:
        raise ImportError(
            f"rag_lookahead.serve.{name} needs the serve extra: pip install 'rag-lookahead[serve]' ({err})"
        ) from err
    return getattr(module, name)
