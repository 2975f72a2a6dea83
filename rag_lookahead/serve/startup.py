"""A server that listens from its first second, while its engine is still being made.

`StartingApp` is an ASGI app around the one `create_app` makes: the server listens at once,
and its lifespan starts ``build`` in a worker thread (loading the model, converting it on first
use, choosing its kernels, measuring its costs). Until that app is ready, ``GET /health``
answers 503 ``{"status": "starting", "stage": ...}`` (the stage under way: what a load
balancer or a waiting script shows) and every other route 503 in OpenAI's error shape, code
``starting``; then the app answers everything, ``/health`` 200. A build that fails makes
``/health`` say so (``"status": "failed"``) and the server stop (`failed`). Each stage is logged
to the ``rag_lookahead.serve.startup`` logger as it starts and with its seconds as it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import FastAPI
from starlette.responses import JSONResponse

from rag_lookahead.serve.errors import error_body
from rag_lookahead.serve.settings import ServeSettings

if TYPE_CHECKING:
    from rag_lookahead.serve.app import ServerState

__all__ = ["STARTUP_LOGGER", "StartingApp", "StartupStages"]

#: Where each start-up stage is logged, with its seconds.
STARTUP_LOGGER = "rag_lookahead.serve.startup"
# What a client is told to wait before asking again while the server starts.
_RETRY_AFTER_S = "1"


class StartupStages:
    """The stage a start-up is in, readable from any thread; `stage` marks one, logged as it
    starts and with its seconds as it ends. ``clock``: the seconds it reads (a test's own)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._current = "starting the server"
        self.seconds: dict[str, float] = {}  # each stage ended, by name, in order

    @property
    def current(self) -> str:
        with self._lock:
            return self._current

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Mark the block as the stage ``name`` (logged at its start and its end)."""
        with self._lock:
            self._current = name
        log = logging.getLogger(STARTUP_LOGGER)
        log.info("start-up: %s ...", name)
        started = self._clock()
        yield
        took = self._clock() - started
        with self._lock:
            self.seconds[name] = took
        log.info("start-up: %s done in %.1f s", name, took)


class StartingApp:
    """The app ``build`` makes (from `create_app`), served as soon as the server listens: 503
    while ``build`` runs in a worker thread, marking its stages on the `StartupStages` it is
    given (see the module). ``settings`` are those ``build`` serves with (the server's
    connection settings are read before the app exists)."""

    def __init__(
        self,
        build: Callable[[StartupStages], FastAPI],
        settings: ServeSettings,
        stages: StartupStages | None = None,
    ) -> None:
        self.settings = settings
        self.stages = stages or StartupStages()
        self._build = build
        self._app: FastAPI | None = None
        self._failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._lifespans = AsyncExitStack()

    @property
    def app(self) -> FastAPI | None:
        """The app, once built and started; ``None`` until then."""
        return self._app

    @property
    def served(self) -> ServerState | None:
        """What the app serves with, once built (`ServerState`)."""
        return None if self._app is None else self._app.state.lookahead

    def build_now(self) -> FastAPI:
        """The app made in the calling thread, as the server makes it in a worker (for a caller
        with no server, a test say); not started, nor kept."""
        return self._build(self.stages)

    @property
    def failed(self) -> BaseException | None:
        """Why the build failed, if it did (the server then stops)."""
        return self._failure

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif self._app is not None:
            await self._app(scope, receive, send)
        elif scope["type"] == "http":
            await self._starting(scope)(scope, receive, send)
        # (a websocket while starting: closed unanswered)

    def _starting(self, scope: dict[str, Any]) -> JSONResponse:
        """The answer while the app is not ready: 503, saying the stage."""
        stage = self.stages.current
        if scope.get("path") == "/health":
            body: dict[str, Any] = {"status": "starting", "stage": stage}
            if self._failure is not None:
                body = {"status": "failed", "stage": stage, "error": str(self._failure)}
            return JSONResponse(body, status_code=503, headers={"Retry-After": _RETRY_AFTER_S})
        message = f"the server is starting ({stage}); try again shortly"
        if self._failure is not None:
            message = f"the server failed to start ({stage}: {self._failure})"
        return JSONResponse(
            error_body(503, message, "starting"), status_code=503, headers={"Retry-After": _RETRY_AFTER_S}
        )

    async def _lifespan(self, receive: Any, send: Any) -> None:
        """ASGI's lifespan: started at once (the build runs meanwhile); stopped with the app's
        own lifespan, if it got that far."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._task = asyncio.create_task(self._built())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._task is not None and not self._task.done():
                    self._task.cancel()  # (a build under way in its thread is left to end)
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._task
                await self._lifespans.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _built(self) -> None:
        """Build the app in a worker thread, then start its own lifespan; then serve it."""
        try:
            app = await anyio.to_thread.run_sync(self._build, self.stages)
            with self.stages.stage("starting the app"):
                await self._lifespans.enter_async_context(app.router.lifespan_context(app))
        except Exception as err:
            logging.getLogger(STARTUP_LOGGER).exception("start-up failed (%s)", self.stages.current)
            self._failure = err
            return
        self._app = app
        logging.getLogger(STARTUP_LOGGER).info("start-up: ready")
