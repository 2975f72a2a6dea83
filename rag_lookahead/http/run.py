"""Running an app with uvicorn, draining on SIGTERM or Ctrl-C.

On the signal the app refuses new requests (503, and ``/health`` says so to a load balancer),
streams already running get `ServeSettings.drain_s` to finish, and whole replies as long
(uvicorn's graceful shutdown); what is still running then is cancelled, which closes its call.
"""

from __future__ import annotations

from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

__all__ = ["DrainingServer", "run_app"]

# Past the drain: time for the calls cancelled then to end at their next step.
_CLOSE_MARGIN_S = 2.0


class DrainingServer(uvicorn.Server):
    """A uvicorn server that calls ``on_exit`` first when told to stop."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def run_app(app: FastAPI, host: str, port: int) -> None:
    """Serve ``app`` (from `create_app`) on ``host``:``port`` until a signal stops it."""
    state = app.state.lookahead
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        timeout_graceful_shutdown=int(state.settings.drain_s + _CLOSE_MARGIN_S),
    )
    DrainingServer(config, state.admission.close).run()
