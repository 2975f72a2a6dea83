"""What each replica of the app runs with when several serve side by side (Ray Serve): how it
loads its engine (`EngineLoad`: `LoadOptions` and drafting settings, plain values sent to every
replica) and the app it serves (`replica_app`: every answer names the replica, corpus routes
are refused).

Replicas share nothing, so every request must carry what it drafts from (``documents``). A
corpus (``/v1/corpora``) would live in one replica's trie while the next request naming it may
reach another, and vanish when its replica restarts: a replica refuses those routes (501).
Nothing here imports Ray; `rag_lookahead.serve.ray_serve` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.loading import LoadOptions
from rag_lookahead.serve.errors import error_body

if TYPE_CHECKING:
    from rag_lookahead.engine import LookaheadEngine

__all__ = ["CORPORA_REFUSED", "REPLICA_HEADER", "EngineLoad", "replica_app"]

#: The response header naming the replica that answered.
REPLICA_HEADER = "x-rag-lookahead-replica"
#: What a replica answers on ``/v1/corpora`` (with HTTP 501).
CORPORA_REFUSED = (
    "corpora are not available on a replicated server: a corpus would live in one replica's trie "
    "while the next request may reach another; send the documents with each request (documents=)"
)
_CORPORA_ROUTE = "/v1/corpora"


@dataclass(frozen=True)
class EngineLoad(LoadOptions):
    """How a replica makes its engine: the `LoadOptions` of its model (plain values, which
    travel to every replica; each loads its own copy), and its drafting settings. Its
    ``model`` is a built-in model's name, or a directory present at this path wherever a
    replica runs.

    Attributes:
        config: The drafting settings (``None``: the defaults).
    """

    config: LookaheadConfig | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.config is not None and not isinstance(self.config, LookaheadConfig):
            raise TypeError(f"config must be a LookaheadConfig or None, got {type(self.config).__name__}")

    def load(self, config: LookaheadConfig | None = None) -> LookaheadEngine:
        """The engine, drafting with ``config`` or else this load's own."""
        from rag_lookahead.engine import LookaheadEngine  # torch loads in the replica only

        return LookaheadEngine.from_pretrained(config=config or self.config, load=self)


def replica_app(app: FastAPI, replica: str) -> FastAPI:
    """``app`` (from `create_app`) as the replica named ``replica``: its answers carry
    `REPLICA_HEADER`, and ``/v1/corpora`` routes answer 501 in OpenAI's error shape."""
    if not isinstance(replica, str) or not replica or not replica.isprintable():
        raise ValueError(f"replica must be a non-empty printable string, got {replica!r}")
    app.add_middleware(_ReplicaMiddleware, replica=replica)
    return app


class _ReplicaMiddleware:
    """Plain ASGI rather than Starlette's ``BaseHTTPMiddleware``, which would hide a client's
    disconnect from the app (the app ends a call when its client leaves)."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self._app = app
        self._replica = replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append(REPLICA_HEADER, self._replica)
            await send(message)

        route = _route(scope)
        if route == _CORPORA_ROUTE or route.startswith(f"{_CORPORA_ROUTE}/"):
            refused = error_body(501, CORPORA_REFUSED, "corpora_unavailable")
            await JSONResponse(refused, status_code=501)(scope, receive, named)
            return
        await self._app(scope, receive, named)


def _route(scope: Scope) -> str:
    """The request's path below the app's mount point (Ray Serve's ``route_prefix``)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
