"""This engine behind an OpenAI-compatible HTTP server (``rag-lookahead serve --backend local``).

`create_app` builds a FastAPI app over one engine; `ServeSettings` says how it serves. Needs
the ``serve`` extra (FastAPI, uvicorn, sse-starlette, prometheus-client); nothing in the core
imports this package.
"""

from rag_lookahead.http.app import ServerState, create_app
from rag_lookahead.http.errors import ApiError
from rag_lookahead.http.settings import ServeSettings

__all__ = ["ApiError", "ServeSettings", "ServerState", "create_app"]
