"""A live server for tests (all three suites): uvicorn serving an app on a free 127.0.0.1 port,
in a background thread. Nothing here leaves the loopback interface."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

__all__ = ["LiveServer", "wait_until"]

WAIT_S = 60.0  # a bound for a test that would otherwise hang, never a measurement


def wait_until(condition: Callable[[], object], seconds: float = WAIT_S) -> None:
    """Return once ``condition()`` is true; fail (AssertionError) after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the server did not get there"
        time.sleep(0.01)


class LiveServer:
    """uvicorn serving ``app`` on a free 127.0.0.1 port, in a background thread."""

    def __init__(self, app: Any) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started)

    @property
    def base_url(self) -> str:
        """The OpenAI API root, as clients take it."""
        return f"{self.url}/v1"

    def client(self, api_key: str = "none", **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` client of this server (no retries)."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_S)

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
