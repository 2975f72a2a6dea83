"""One streamed request: its chunks as the engine's `StreamChunk`s, its stats, and its end.

The end — the stream read to its last chunk, closed, dropped, failed, or cut here — closes the
HTTP response (so the server stops generating) and removes the corpus loaded for the call, once.

What the request asked for is checked again as the answer is read, since a server may ignore
it: a stop string ends the text here too, the text stops at what ``max_new_tokens`` tokens can
hold, only the first choice is read, and the call ends at its deadline however busy the
connection keeps.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from rag_lookahead.remote.logprobs import ServerLogprobs, choice_logprobs
from rag_lookahead.streaming.logprobs import TokenLogprob
from rag_lookahead.streaming.stats import FinishReason, StepRecorder
from rag_lookahead.streaming.stopping import find_stop, held_back
from rag_lookahead.streaming.stream import StreamChunk

__all__ = ["ReadLimits", "ServerCall", "ServerError", "ServerTimeout", "finish_reason"]


class ServerError(RuntimeError):
    """The server's stream broke the OpenAI API's contract (no finish, an unknown reason)."""


class ServerTimeout(ServerError, TimeoutError):
    """A call ran past its deadline."""


@dataclass(frozen=True)
class ReadLimits:
    """What one call's answer may be, checked as it is read.

    Attributes:
        server: The server's URL, named in errors.
        max_new_tokens: The call's token budget.
        chars_per_token: The most characters one token can decode to: the text is cut past
            ``max_new_tokens * chars_per_token``.
        stop_strings: The call's stop strings; the text ends before the first one.
        deadline: Seconds the whole call may take, or ``None``.
        logprobs: Whether the call asked for log probabilities (read off the server's chunks).
    """

    server: str
    max_new_tokens: int
    chars_per_token: int
    stop_strings: tuple[str, ...] = ()
    deadline: float | None = None
    logprobs: bool = False

    @property
    def max_chars(self) -> int:
        return self.max_new_tokens * self.chars_per_token


def finish_reason(choice: Any) -> FinishReason | None:
    """The engine's reason for a streamed choice's ``finish_reason``.

    ``"stop"`` covers both the model's EOS and a stop string; vLLM names the string that
    matched in ``stop_reason`` and SGLang in ``matched_stop`` (a token id there is an EOS).
    """
    reason = getattr(choice, "finish_reason", None)
    if reason is None:
        return None
    if reason == "length":
        return "length"
    if reason == "abort":
        return "abandoned"
    if reason == "stop":
        matched = getattr(choice, "stop_reason", None)
        if matched is None:
            matched = getattr(choice, "matched_stop", None)
        return "stop_string" if isinstance(matched, str) else "eos"
    raise ServerError(f"the server finished with reason {reason!r}, which this engine does not produce")


class _Text:
    """The answer's text as it arrives: released up to a stop string or the length bound, with
    what could still begin a stop string held back until the next piece decides."""

    def __init__(self, limits: ReadLimits) -> None:
        self.limits = limits
        self.released = 0
        self._held = ""  # released text never ends in a stop string's prefix: a stop starts here

    def add(self, piece: str, final: bool) -> tuple[str, FinishReason | None]:
        """The text ``piece`` releases, and the reason the answer ends here (if it does)."""
        stops = self.limits.stop_strings
        text = self._held + piece
        room = self.limits.max_chars - self.released
        stop_at = find_stop(text, stops)
        if stop_at is not None and stop_at <= room:
            return self._release(text[:stop_at], ""), "stop_string"
        if len(text) > room:
            return self._release(text[:room], ""), "length"
        end = len(text) if final else len(text) - held_back(text, stops, 0, len(text))
        return self._release(text[:end], text[end:]), None

    def _release(self, text: str, held: str) -> str:
        self.released += len(text)
        self._held = held
        return text


class ServerCall:
    """The state of one request while its chunks are read."""

    def __init__(self, recorder: StepRecorder, on_end: Callable[[], None], limits: ReadLimits) -> None:
        self.recorder = recorder
        self.response: Any = None
        self.limits = limits
        self._on_end = on_end
        self._ended = False
        self._expired = False
        self._answered = False  # the answer's end is known (only the usage may follow)
        self._lock = threading.Lock()
        self._chunks = 0
        self._text = _Text(limits)
        self._logprobs = ServerLogprobs() if limits.logprobs else None
        self._timer = _start_timer(limits.deadline, self._expire)

    @property
    def ended(self) -> bool:
        return self._ended

    def end(self) -> None:
        """Close the HTTP stream and release the call's corpus (idempotent, any thread)."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        if self._timer is not None:
            self._timer.cancel()
        self.recorder.finish("abandoned")  # the first reason stands: a finished call keeps its own
        try:
            if self.response is not None:
                self.response.close()
        finally:
            self._on_end()

    @property
    def expired(self) -> bool:
        """Whether the call ran past its deadline (the timer may not have fired yet)."""
        deadline = self.limits.deadline
        if deadline is None:
            return False
        return self._expired or time.perf_counter() - self.recorder.started >= deadline

    def check_deadline(self) -> None:
        """Raise `ServerTimeout` if the call ran past its deadline."""
        if self.expired:
            raise self._timeout()

    def _timeout(self) -> ServerTimeout:
        return ServerTimeout(
            f"the server at {self.limits.server} did not finish the answer within the call's "
            f"deadline of {self.limits.deadline} s"
        )

    def steps(self) -> Generator[StreamChunk, None, None]:
        """The response's text as chunks; raises what the server sent, `ServerError`, or
        `ServerTimeout`."""
        try:
            for chunk in self._events():
                if not self._answered:
                    self.check_deadline()
                text, cut, logprobs = self._read(chunk)
                if text or logprobs:
                    yield StreamChunk([], text, logprobs)
                if cut:
                    return  # the rest is never read: the end closes the response
            if not self._answered:
                self.check_deadline()
                raise ServerError(
                    f"the server at {self.limits.server} ended the stream before the answer finished"
                )
        except Exception as err:
            if self.expired and not self._answered:
                raise self._timeout() from err
            if self._ended:
                return  # closed from elsewhere while a chunk was being read
            raise
        finally:
            self.end()

    def _events(self) -> Iterator[Any]:
        """The response's chunks, with a malformed event named as the server's."""
        events = iter(self.response)
        while True:
            try:
                chunk = next(events)
            except StopIteration:
                return
            except ValueError as err:  # the client parses each event's data as JSON
                if self.expired or self._ended:
                    raise
                raise ServerError(
                    f"the server at {self.limits.server} sent a malformed server-sent event: {err}"
                ) from err
            yield chunk

    def _read(self, chunk: Any) -> tuple[str, FinishReason | None, list[TokenLogprob] | None]:
        """The text a chunk releases, the reason the call is cut here (if it is), and the log
        probabilities of the tokens that text reached (when the call asked for them)."""
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self._count(usage)
        piece, reason = self._first_choice(chunk)
        text, cut = self._text.add(piece, final=reason is not None)
        logprobs = None
        if self._logprobs is not None:
            ended_as_sent = reason is not None and cut is None
            logprobs = self._logprobs.release(self._text.released, ended_as_sent)
        ending = cut or reason  # a cut here wins over the server's reason: its text was cut
        if ending is not None:
            self.recorder.finish(ending)
            self._answered = True
        if text:
            recorder = self.recorder
            if not self._chunks:
                recorder.prefill_seconds = time.perf_counter() - recorder.started
            self._chunks += 1
            # Until usage says: a chunk holds at least one token, and the budget caps them.
            counted = min(self._chunks, self.limits.max_new_tokens)
            recorder.new_tokens = max(recorder.new_tokens, counted)
        return text, cut, logprobs

    def _first_choice(self, chunk: Any) -> tuple[str, FinishReason | None]:
        """The text and finish of the chunk's choice 0: the request asks for one choice, and
        another one's text (a server that answers ``n`` anyway) is not part of it."""
        text = ""
        reason: FinishReason | None = None
        for choice in getattr(chunk, "choices", None) or ():
            if (getattr(choice, "index", None) or 0) != 0:
                continue
            delta = getattr(choice, "delta", None)
            piece = getattr(delta, "content", None) if delta is not None else getattr(choice, "text", None)
            if piece is not None and not isinstance(piece, str):
                server = self.limits.server
                raise ServerError(f"the server at {server} sent text that is not a string: {piece!r}")
            text += piece or ""
            reason = finish_reason(choice) or reason
            if self._logprobs is not None:
                self._logprobs.add(self._choice_logprobs(choice))
        return text, reason

    def _choice_logprobs(self, choice: Any) -> list[TokenLogprob]:
        try:
            return choice_logprobs(choice)
        except ValueError as err:
            raise ServerError(f"the server at {self.limits.server} sent malformed logprobs: {err}") from None

    def _count(self, usage: Any) -> None:
        recorder = self.recorder
        recorder.prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        recorder.new_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        if cached:
            recorder.cached_prompt_tokens = int(cached)
        completion = getattr(usage, "completion_tokens_details", None)  # a prediction's counts
        recorder.accepted_prediction = int(getattr(completion, "accepted_prediction_tokens", 0) or 0)
        recorder.rejected_prediction = int(getattr(completion, "rejected_prediction_tokens", 0) or 0)

    def _expire(self) -> None:
        """Past the deadline: wake the read in progress (keep-alive comments never reach this
        engine, so it cannot look at the clock between them); the reader raises."""
        self._expired = True
        if self._ended or self._answered:
            return
        network = _socket(self.response)
        if network is not None:
            with contextlib.suppress(OSError):
                network.shutdown(socket.SHUT_RDWR)
        elif self.response is not None:
            self.end()


def _start_timer(seconds: float | None, action: Callable[[], None]) -> threading.Timer | None:
    if seconds is None:
        return None
    timer = threading.Timer(seconds, action)
    timer.daemon = True  # a forgotten call never keeps the interpreter alive
    timer.start()
    return timer


def _socket(response: Any) -> socket.socket | None:
    """The socket under an ``openai`` stream, if the transport exposes it (httpcore does)."""
    http = getattr(response, "response", None)
    stream = getattr(http, "extensions", {}).get("network_stream") if http is not None else None
    found = stream.get_extra_info("socket") if stream is not None else None
    return found if isinstance(found, socket.socket) else None
