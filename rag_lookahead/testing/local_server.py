"""The local server on 127.0.0.1 in a background thread, for tests (all three suites).

`LiveServer` runs an app under uvicorn on a free loopback port; `served_engine` is the tiny
in-process engine the server tests serve; `leftovers` says what a settled server still holds
(requests, calls, trie branches), empty when nothing lingers. Needs the ``serve`` extra.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.serve.app import create_app
from rag_lookahead.serve.run import DrainingServer, server_config
from rag_lookahead.serve.settings import ServeSettings
from rag_lookahead.serve.startup import StartingApp
from rag_lookahead.streaming.stream import TextStream
from rag_lookahead.testing import ASCII_VOCAB, ascii_fast_tokenizer, tiny_model

if TYPE_CHECKING:
    import httpx
    import openai

    from rag_lookahead.serve.app import ServerState

__all__ = [
    "DEAD_END_FORMAT",
    "WAIT_S",
    "LiveServer",
    "ScopedCalls",
    "error_of",
    "leftovers",
    "logged_errors",
    "recording_documents",
    "served_engine",
    "settled_server",
    "wait_until",
]

WAIT_S = 60.0  # a bound for a test that would otherwise hang, never a measurement
# `served_engine`'s ASCII vocabulary cannot spell "\u00e9": this grammar allows a token it then
# cannot continue from, so a call under it fails while generating (a dead end).
DEAD_END_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "dead", "schema": {"type": "string", "pattern": "^aaa\u00e9$"}},
}


class LiveServer:
    """``app`` (from `create_app`, or a `StartingApp`) on a free 127.0.0.1 port, in a
    background thread, served as `run_app` serves it (`DrainingServer`, `server_config`):
    ``server.handle_exit(signal.SIGTERM, None)`` drains it as the signal would; `stop` stops it
    at once."""

    def __init__(self, app: Any) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.app = app
        self.port = int(sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        config = server_config(app, "127.0.0.1", self.port, log_level="warning")
        self.server = DrainingServer(config, app if isinstance(app, StartingApp) else app.state.lookahead)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive())
        assert self.server.started, "the server did not start"

    @property
    def base_url(self) -> str:
        """The OpenAI API root, as clients take it."""
        return f"{self.url}/v1"

    def client(self, api_key: str = "none", **kwargs: Any) -> openai.OpenAI:
        """An `openai.OpenAI` client of this server that never retries."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_S)

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """The error ``response`` carries, once its status is ``status`` and the error is in
    OpenAI's shape, with a message."""
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"} and error["message"]
    return error


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def logged_errors() -> Iterator[list[logging.LogRecord]]:
    """What the server logs at ERROR or above within the block (uvicorn's "Exception in ASGI
    application" among them), in a list filled as it comes."""
    handler = _Records()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "rag_lookahead")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def wait_until(condition: Callable[[], object], timeout_s: float = WAIT_S) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout_s`` (a bound, not a measurement)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the server did not get there"
        time.sleep(0.01)


def served_engine() -> LookaheadEngine:
    """The tiny model and its fast ASCII tokenizer (with ``<eos>``, for grammars), in process."""
    model = tiny_model("llama", 0, ASCII_VOCAB + 1)
    model.generation_config.eos_token_id = ASCII_VOCAB
    config = LookaheadConfig(mode="trie", min_query_length=1, max_batch_size=8)
    return LookaheadEngine(model, ascii_fast_tokenizer(), config)


def recording_documents(engine: LookaheadEngine, into: list[list[str]]) -> Callable[..., TextStream]:
    """``engine.stream``, appending each call's documents to ``into``: to set in its place."""
    stream = engine.stream

    def recording(*args: Any, **kwargs: Any) -> TextStream:
        into.append(list(kwargs.get("documents", ())))
        return stream(*args, **kwargs)

    return recording


class ScopedCalls:
    """``engine`` with each of its calls recorded: the number of sequences in the call's scope
    (0 without one) and its stream, to read what a served call drafted from."""

    def __init__(self, engine: LookaheadEngine) -> None:
        self.engine = engine
        self.calls: list[tuple[int, TextStream]] = []
        stream = engine.stream

        def recording(*args: Any, **kwargs: Any) -> TextStream:
            scope = kwargs.get("scope")
            self.calls.append((len(scope.sequences) if scope is not None else 0, stream(*args, **kwargs)))
            return self.calls[-1][1]

        engine.stream = recording  # type: ignore[method-assign]


@contextmanager
def settled_server(engine: LookaheadEngine, model_name: str) -> Iterator[LiveServer]:
    """``engine``'s app on loopback; on leaving, once every call has ended (`leftovers` is
    empty, or the wait fails), the server stops."""
    server = LiveServer(create_app(engine, ServeSettings(model_name=model_name)))
    try:
        yield server
        wait_until(lambda: not leftovers(server.app.state.lookahead))
    finally:
        server.stop()


def leftovers(state: ServerState) -> list[str]:
    """What the server still holds with no request in flight: nothing, when every request's
    call ended and its branches left the trie."""
    held = []
    if state.admission.running or state.admission.waiting:
        held.append(f"{state.admission.running} running and {state.admission.waiting} waiting requests")
    engine = state.engine
    if isinstance(engine, LookaheadEngine):
        branches = engine.trie.owners() - {OUTPUT_OWNER}
        if branches:
            held.append(f"trie branches of {sorted(branches)}")
        scheduler = engine.scheduler
        calls = [
            scheduler._waiting,
            scheduler._preparing,
            scheduler._joining,
            scheduler._rows.calls,
            scheduler._alone,
        ]
        if any(calls):
            held.append(f"{sum(map(len, calls))} calls in the engine's scheduler")
    return held
