"""One request's engine call: opened in a worker thread, read without blocking the loop,
and closed from the loop when its client goes (the call ends, its branches leave the trie).
A call naming a corpus holds it from before it waits for a slot until it is closed. When a
stopping server's drain runs out (`Caller.stop`), the calls still open are cut, and each
request is told so: a stream by an error event before ``[DONE]``, a whole reply by a 503."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import anyio

from rag_lookahead.interface import Engine
from rag_lookahead.protocol import CallPlan, ReplyHeader, ReplyStream, reply
from rag_lookahead.serve.admission import Admission, Slot
from rag_lookahead.serve.corpora import Corpora, CorpusLease
from rag_lookahead.serve.errors import ApiError, error_body
from rag_lookahead.serve.metrics import ServerMetrics
from rag_lookahead.streaming import aiterate
from rag_lookahead.streaming.logprobs import TokenLogprob
from rag_lookahead.streaming.stats import DecodeStats
from rag_lookahead.streaming.stream import StreamChunk, TextStream

__all__ = ["Caller", "ChatEvents", "OpenAIShape", "OpenCall", "ReplyEvents", "ReplyShape"]

DONE = "[DONE]"
_CUT = "the server stopped before this answer ended: its drain time ran out (retry the request)"


class OpenCall:
    """A started call with its running slot and corpus lease; `close` (idempotent) ends all."""

    def __init__(
        self,
        stream: TextStream,
        slot: Slot,
        lease: CorpusLease | None,
        metrics: ServerMetrics,
        started: float,
        registry: set[OpenCall] | None = None,
    ) -> None:
        self.stream = stream
        self._slot = slot
        self._lease = lease
        self._metrics = metrics
        self._started = started
        self._registry = registry if registry is not None else set()
        self._registry.add(self)
        self._first = True
        self._closed = False
        self._cut = False

    @property
    def cut(self) -> bool:
        """Whether the server cut the call (`cut_short`) before it ended by itself."""
        return self._cut and self.stream.stats.finish_reason == "abandoned"

    async def cut_short(self) -> None:
        """End the call now, as the server stops: its reader tells its client (`cut`)."""
        self._cut = True
        await self.close()

    async def pieces(self) -> AsyncIterator[StreamChunk]:
        """The call's chunks as they are decided (timing its first text)."""
        async for chunk in aiterate(self.stream.chunks()):
            if chunk.text and self._first:
                self._first = False
                self._metrics.time_to_first_token.observe(time.perf_counter() - self._started)
            yield chunk

    async def close(self) -> None:
        """End the call from the event loop, even from a cancelled task, and free its slot."""
        if self._closed:
            return
        self._closed = True
        self._registry.discard(self)
        # Shielded: a disconnect cancels the task that closes.
        with anyio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            finally:
                self._slot.release()
                self._metrics.record(self.stream.stats)
                await _release(self._lease)  # the call has ended: its corpus may go now


class Caller:
    """Opens plans' calls on the engine and answers them, whole or as server-sent events."""

    def __init__(
        self, engine: Engine, admission: Admission, corpora: Corpora, metrics: ServerMetrics
    ) -> None:
        self._engine = engine
        self._admission = admission
        self._corpora = corpora
        self._metrics = metrics
        self._open: set[OpenCall] = set()
        self._stopped = False

    async def stop(self) -> None:
        """Cut every open call (a stopping server's drain ran out), and refuse new ones (503)."""
        self._stopped = True
        for call in list(self._open):
            await call.cut_short()

    async def open(self, plan: CallPlan, started: float) -> OpenCall:
        """Hold the plan's corpus (404 if there is none by that id), wait for a running slot,
        then start the call; a call refused at its start (a prompt past the context window, a
        grammar that cannot be used) is HTTP 400."""
        lease = None
        if plan.corpus is not None:
            lease = await anyio.to_thread.run_sync(self._corpora.lease, plan.corpus)
        try:
            slot = await self._admission.enter()
            if self._stopped:  # it waited for its slot while the server stopped
                slot.release()
                raise ApiError(503, "the server is shutting down", code="shutting_down")
        except BaseException:
            await _release(lease)
            raise
        kwargs = plan.stream_kwargs()
        if lease is not None:
            kwargs["scope"] = lease.scope
        try:
            stream = await anyio.to_thread.run_sync(
                functools.partial(self._engine.stream, plan.prompt, plan.params, **kwargs)
            )
        except BaseException as err:
            slot.release()
            await _release(lease)
            if isinstance(err, (TypeError, ValueError)):
                raise ApiError(400, str(err), code="invalid_request") from None
            raise
        call = OpenCall(stream, slot, lease, self._metrics, started, self._open)
        if self._stopped:  # it started while the server cut the others
            await call.cut_short()
        return call

    async def whole(self, plan: CallPlan, header: ReplyHeader, started: float) -> dict[str, Any]:
        """The whole reply; a call that fails while generating is HTTP 500 with its error, one
        the server cut as it stopped is 503."""
        call = await self.open(plan, started)
        try:
            text = "".join([piece.text async for piece in call.pieces()])
        except Exception as err:
            raise ApiError(500, f"generation failed: {err}", code="generation_failed") from None
        finally:
            await call.close()
        if call.cut:
            raise ApiError(503, _CUT, code="shutting_down")
        return reply(plan, header, text, call.stream.stats, call.stream.logprobs)

    async def events(self, call: OpenCall, out: ReplyEvents) -> AsyncIterator[dict[str, str]]:
        """The reply's server-sent events, as ``out`` writes them; a call that fails while
        generating, or that the server cut as it stopped, ends with ``out``'s error events
        instead of its end (the headers are gone by then): no client takes a cut answer for
        whole."""
        try:
            try:
                for event in out.start():
                    yield event
                async for piece in call.pieces():
                    for event in out.add(piece.text, piece.logprobs):
                        yield event
                if call.cut:
                    last = out.failed(error_body(503, _CUT, "shutting_down"))
                else:
                    last = out.end(call.stream.stats)
            except Exception as err:
                last = out.failed(error_body(500, f"generation failed: {err}", "generation_failed"))
            for event in last:
                yield event
        finally:
            await call.close()


class ReplyEvents(Protocol):
    """A streamed reply in a route's shape, as server-sent events (``sse_starlette``'s dicts):
    `start`, `add` for each piece of text, then `end`, or `failed` with the error object."""

    def start(self) -> list[dict[str, str]]: ...

    def add(self, text: str, logprobs: Sequence[TokenLogprob] | None) -> list[dict[str, str]]: ...

    def end(self, stats: DecodeStats) -> list[dict[str, str]]: ...

    def failed(self, error: dict[str, Any]) -> list[dict[str, str]]: ...


class ReplyShape(Protocol):
    """How a route answers its call: the whole reply, read off the call's OpenAI reply
    (`reply`), and a streamed reply's events."""

    def whole(self, reply: dict[str, Any]) -> dict[str, Any]: ...

    def events(self) -> ReplyEvents: ...


class OpenAIShape:
    """``/v1/chat/completions`` and ``/v1/completions``: the OpenAI reply as it is."""

    def __init__(self, plan: CallPlan, header: ReplyHeader) -> None:
        self._plan = plan
        self._header = header

    def whole(self, reply: dict[str, Any]) -> dict[str, Any]:
        return reply

    def events(self) -> ReplyEvents:
        return ChatEvents(self._plan, self._header)


class ChatEvents:
    """A chat or completion reply's events (`ReplyStream`'s chunks), ``[DONE]`` last."""

    def __init__(self, plan: CallPlan, header: ReplyHeader) -> None:
        self._out = ReplyStream(plan, header)

    def start(self) -> list[dict[str, str]]:
        return [_event(chunk) for chunk in self._out.start()]

    def add(self, text: str, logprobs: Sequence[TokenLogprob] | None) -> list[dict[str, str]]:
        return [_event(chunk) for chunk in self._out.add(text, logprobs)]

    def end(self, stats: DecodeStats) -> list[dict[str, str]]:
        return [*(_event(chunk) for chunk in self._out.end(stats)), {"data": DONE}]

    def failed(self, error: dict[str, Any]) -> list[dict[str, str]]:
        return [_event(error), {"data": DONE}]


async def _release(lease: CorpusLease | None) -> None:
    """Let go of a corpus, off the loop (the last call of a deleted one removes its branches)."""
    if lease is not None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lease.release)


def _event(payload: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(payload, ensure_ascii=False)}
