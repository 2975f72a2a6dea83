"""Running an app with uvicorn, draining on SIGTERM or Ctrl-C.

On the signal the server keeps listening but refuses new requests (503, and ``/health`` says
so to a load balancer) while the requests running get `ServeSettings.drain_s` to finish; what
still runs then is cut, each request told so (a stream's last events are an error and
``[DONE]``, a whole reply is a 503); then uvicorn stops. A drain is how the server is meant
to stop: the process exits 0. uvicorn's own handling would close the listener and idle
connections at once, and cut streams without a word after its graceful timeout.
"""

from __future__ import annotations

import asyncio
import math
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI

from rag_lookahead.serve.connections import guarded_protocol
from rag_lookahead.serve.settings import ServeSettings
from rag_lookahead.serve.startup import StartingApp

if TYPE_CHECKING:
    from rag_lookahead.serve.app import ServerState

__all__ = ["DrainingServer", "run_app", "server_config"]

# Past the drain: time for the requests cut then to send their last events.
_CLOSE_MARGIN_S = 2.0
_POLL_S = 0.05


class DrainingServer(uvicorn.Server):
    """A uvicorn server over an app from `create_app` (its ``state``), or over a `StartingApp`,
    that drains when told to stop (see the module): the first signal starts the drain, a second
    one cuts what still runs at once. A `StartingApp` stopped before its app is ready stops at
    once (nothing runs to drain), and one whose build failed stops the server."""

    def __init__(self, config: uvicorn.Config, state: ServerState | StartingApp) -> None:
        super().__init__(config)
        self._state = state
        self._signals = 0
        self._drain: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()  # the requests the drain waits for

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: flags only. The drain runs on the loop (`on_tick`), and the signal
        # is not recorded for uvicorn to raise again once stopped (which would exit -15).
        served = self._served()
        if served is None:
            self.should_exit = True  # still starting: nothing to drain
            return
        served.admission.close()  # from now on, new requests and /health are 503
        self._signals += 1

    def _served(self) -> ServerState | None:
        """What the app serves with (``None`` while a `StartingApp` is not ready)."""
        return self._state.served if isinstance(self._state, StartingApp) else self._state

    async def on_tick(self, counter: int) -> bool:
        if isinstance(self._state, StartingApp) and self._state.failed is not None:
            self.should_exit = True
        if self._signals and self._drain is None:
            self._drain = asyncio.create_task(self._drained())
        if self._drain is not None and self._drain.done():
            self._drain.result()  # a failed drain fails the server
            self.should_exit = True
        return await super().on_tick(counter)

    async def _drained(self) -> None:
        """Wait for the running requests to end, up to the drain's end (or a second signal);
        then cut what still runs, and give it a moment to say so."""
        served = self._served()
        assert served is not None, "only a ready app drains"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + served.settings.drain_s
        # Those in flight now: the 503s answered meanwhile (a balancer's probes) keep no drain open.
        self._running = set(self.server_state.tasks)
        while self._busy() and loop.time() < deadline and self._signals < 2:
            await asyncio.sleep(_POLL_S)
        if not self._busy():
            return
        await served.caller.stop()
        deadline = loop.time() + _CLOSE_MARGIN_S
        while self._busy() and loop.time() < deadline:
            await asyncio.sleep(_POLL_S)

    def _busy(self) -> bool:
        """Whether a request that came before the drain is still in flight."""
        return any(not task.done() for task in self._running)


def server_config(
    app: FastAPI | StartingApp, host: str, port: int, *, log_level: str = "info"
) -> uvicorn.Config:
    """uvicorn's config for ``app`` (from `create_app`, or a `StartingApp`): its settings'
    connection cap and read timeouts (`guarded_protocol`), keep-alive, and what uvicorn's own
    shutdown still waits for once the drain is over."""
    settings: ServeSettings = app.settings if isinstance(app, StartingApp) else app.state.lookahead.settings
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=guarded_protocol(settings),
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]  # any seconds: call_later
        timeout_graceful_shutdown=math.ceil(_CLOSE_MARGIN_S),
    )


def run_app(app: FastAPI | StartingApp, host: str, port: int) -> None:
    """Serve ``app`` (from `create_app`, or a `StartingApp`, which listens while it builds
    its app) on ``host``:``port`` until a signal stops it, draining; the build's error, if
    it failed."""
    state = app if isinstance(app, StartingApp) else app.state.lookahead
    DrainingServer(server_config(app, host, port), state).run()
    if isinstance(app, StartingApp) and app.failed is not None:
        raise app.failed
