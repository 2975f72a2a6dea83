"""A stub OpenAI-compatible server on the loopback interface, for tests (all three suites).

It records every request and answers from a script: streamed answers (server-sent events, as
vLLM and SGLang send them), HTTP errors, stalls, and SGLang's corpus endpoints. Nothing here
leaves 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Answer", "Events", "Failure", "Recorded", "StubServer", "stub_server"]


@dataclass(frozen=True)
class Recorded:
    """One request the stub received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass(frozen=True)
class Answer:
    """A streamed answer: its text pieces, then the finish chunk and the usage chunk.

    ``finish=None`` ends the stream without a finish reason (a broken server); ``stall``
    waits that many seconds before answering at all; ``pause`` between two pieces.
    """

    pieces: Sequence[str] = ("Hello", ", world")
    finish: str | None = "stop"
    stop_reason: Any = None  # vLLM's name for the stop string (or token id) that matched
    matched_stop: Any = None  # SGLang's
    usage: tuple[int, int] | None = (7, 3)
    stall: float = 0.0
    pause: float = 0.0
    logprobs: bool = False  # each piece is one token, of log probability -(its index + 1) / 10


@dataclass(frozen=True)
class Events:
    """A stream written as it is given, as a broken or hostile server sends it: each item
    (server-sent-event text, e.g. ``": keep-alive\n\n"`` or ``"data: {...}\n\n"``), then
    ``pause`` seconds; nothing is added, not even ``[DONE]``."""

    items: Sequence[str]
    pause: float = 0.0


@dataclass(frozen=True)
class Failure:
    """An HTTP error answer."""

    status: int
    message: str = "stub failure"
    headers: dict[str, str] = field(default_factory=dict)


class StubServer:
    """Answers chat and text completions from a queue (`Answer()` when it is empty)."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.replies: deque[Answer | Events | Failure] = deque()
        self.corpora: dict[str, list[str]] = {}
        self.fail_corpus: set[str] = set()  # endpoint names that answer 400
        self.metrics_text = ""
        self.disconnected = threading.Event()  # a client closed a stream the stub was writing
        self.pieces_sent = 0
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def reply(self, *replies: Answer | Events | Failure) -> None:
        """Answer the next completion requests with these, in order."""
        self.replies.extend(replies)

    def completions(self) -> list[Recorded]:
        """The chat and text completion requests received so far."""
        return [r for r in self.requests if r.path.endswith("completions")]

    def start(self) -> StubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    # ------------------------------------------------------------------ answering

    def _next_reply(self) -> Answer | Events | Failure:
        with self._lock:
            return self.replies.popleft() if self.replies else Answer()

    def _record(self, request: Recorded) -> None:
        with self._lock:
            self.requests.append(request)


def _handler(stub: StubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def do_GET(self) -> None:
            stub._record(Recorded("GET", self.path, _headers(self), None))
            if self.path == "/list_external_corpora":
                counts = {k: sum(len(d.split()) for d in v) for k, v in stub.corpora.items()}
                self._corpus_answer("list_external_corpora", {"corpus_token_counts": counts})
            elif self.path == "/metrics":
                self._send(200, stub.metrics_text.encode(), "text/plain")
            else:
                self._json(404, {"error": {"message": f"no {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            stub._record(Recorded("POST", self.path, _headers(self), body))
            if self.path.endswith(("/chat/completions", "/completions")):
                self._completion(body, chat=self.path.endswith("/chat/completions"))
            elif self.path == "/add_external_corpus":
                corpus_id = body.get("corpus_id") or f"c{len(stub.corpora)}"
                if "add_external_corpus" not in stub.fail_corpus:
                    stub.corpora[corpus_id] = list(body.get("documents") or [])
                self._corpus_answer("add_external_corpus", {"corpus_id": corpus_id})
            elif self.path == "/remove_external_corpus":
                corpus_id = body.get("corpus_id")
                if "remove_external_corpus" not in stub.fail_corpus:
                    stub.corpora.pop(corpus_id, None)
                self._corpus_answer("remove_external_corpus", {})
            else:
                self._json(404, {"error": {"message": f"no {self.path}"}})

        def _corpus_answer(self, endpoint: str, fields: dict[str, Any]) -> None:
            if endpoint in stub.fail_corpus:
                self._json(400, {"success": False, "message": f"{endpoint} refused by the stub"})
            else:
                self._json(200, {"success": True, "message": "", **fields})

        def _completion(self, body: dict[str, Any], chat: bool) -> None:
            reply = stub._next_reply()
            if isinstance(reply, Failure):
                self._json(reply.status, {"error": {"message": reply.message}}, reply.headers)
                return
            if isinstance(reply, Answer):
                time.sleep(reply.stall)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                for item in _stream(reply, body.get("model", ""), chat):  # finite: the reply's own
                    self.wfile.write(item)
                    self.wfile.flush()
                    stub.pieces_sent += 1
                    time.sleep(reply.pause)
            except (BrokenPipeError, ConnectionResetError):
                stub.disconnected.set()

        def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            self._send(status, json.dumps(payload).encode(), "application/json", headers)

        def _send(self, status: int, data: bytes, kind: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _stream(reply: Answer | Events, model: str, chat: bool) -> Iterator[bytes]:
    if isinstance(reply, Events):
        yield from (item.encode() for item in reply.items)
        return
    for chunk in _chunks(reply, model, chat):
        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def _chunks(reply: Answer, model: str, chat: bool) -> Iterator[dict[str, Any]]:
    head: dict[str, Any] = {"id": "stub", "created": 0, "model": model}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    offset = 0
    for i, piece in enumerate(reply.pieces):
        content: dict[str, Any] = {"delta": {"content": piece}} if chat else {"text": piece}
        choice = {"index": 0, **content}
        if reply.logprobs:
            choice["logprobs"] = _piece_logprobs(piece, -(i + 1) / 10, offset, chat)
            offset += len(piece)
        yield {**head, "choices": [{**choice, "finish_reason": None}]}
    if reply.finish is not None:
        last: dict[str, Any] = {"index": 0, "finish_reason": reply.finish}
        if chat:
            last["delta"] = {}
        else:
            last["text"] = ""
        if reply.stop_reason is not None:
            last["stop_reason"] = reply.stop_reason
        if reply.matched_stop is not None:
            last["matched_stop"] = reply.matched_stop
        yield {**head, "choices": [last]}
    if reply.usage is not None:
        prompt, completion = reply.usage
        usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        usage["total_tokens"] = prompt + completion
        yield {**head, "choices": [], "usage": usage}


def _piece_logprobs(piece: str, logprob: float, offset: int, chat: bool) -> dict[str, Any]:
    """One token's log probabilities, as vLLM streams them: OpenAI's chat or legacy shape."""
    if not chat:
        top = {piece: logprob, "?": logprob - 1}
        return {
            "tokens": [piece],
            "token_logprobs": [logprob],
            "top_logprobs": [top],
            "text_offset": [offset],
        }
    token = {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}
    return {
        "content": [{**token, "top_logprobs": [token, {"token": "?", "logprob": logprob - 1, "bytes": [63]}]}]
    }


@contextmanager
def stub_server() -> Iterator[StubServer]:
    """A started `StubServer`, stopped on exit."""
    stub = StubServer().start()
    try:
        yield stub
    finally:
        stub.stop()


def _headers(handler: BaseHTTPRequestHandler) -> dict[str, str]:
    return {name.lower(): value for name, value in handler.headers.items()}
