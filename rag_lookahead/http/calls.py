"""One request's engine call: opened in a worker thread, read without blocking the loop,
and closed from the loop when its client goes (the call ends, its branches leave the trie).
A call naming a corpus holds it from before it waits for a slot until it is closed."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio

from rag_lookahead.adapters import CallPlan, ReplyHeader, ReplyStream, reply
from rag_lookahead.http.admission import Admission, Slot
from rag_lookahead.http.corpora import Corpora, CorpusLease
from rag_lookahead.http.errors import ApiError, error_body
from rag_lookahead.http.metrics import ServerMetrics
from rag_lookahead.interface import Engine
from rag_lookahead.streaming import aiterate
from rag_lookahead.streaming.stream import StreamChunk, TextStream

__all__ = ["Caller", "OpenCall"]

DONE = "[DONE]"


class OpenCall:
    """A started call with its running slot and corpus lease; `close` (idempotent) ends all."""

    def __init__(
        self,
        stream: TextStream,
        slot: Slot,
        lease: CorpusLease | None,
        metrics: ServerMetrics,
        started: float,
    ) -> None:
        self.stream = stream
        self._slot = slot
        self._lease = lease
        self._metrics = metrics
        self._started = started
        self._first = True
        self._closed = False

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

    async def open(self, plan: CallPlan, started: float) -> OpenCall:
        """Hold the plan's corpus (404 if there is none by that id), wait for a running slot,
        then start the call; a call refused at its start (a prompt past the context window, a
        grammar that cannot be used) is HTTP 400."""
        lease = None
        if plan.corpus is not None:
            lease = await anyio.to_thread.run_sync(self._corpora.lease, plan.corpus)
        try:
            slot = await self._admission.enter()
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
        return OpenCall(stream, slot, lease, self._metrics, started)

    async def whole(self, plan: CallPlan, header: ReplyHeader, started: float) -> dict[str, Any]:
        """The whole reply; a call that fails while generating is HTTP 500 with its error."""
        call = await self.open(plan, started)
        try:
            text = "".join([piece.text async for piece in call.pieces()])
        except Exception as err:
            raise ApiError(500, f"generation failed: {err}", code="generation_failed") from None
        finally:
            await call.close()
        return reply(plan, header, text, call.stream.stats, call.stream.logprobs)

    async def events(
        self, call: OpenCall, plan: CallPlan, header: ReplyHeader
    ) -> AsyncIterator[dict[str, str]]:
        """The reply's server-sent events, ``[DONE]`` last; a call that fails while generating
        sends an error event (the headers are gone by then) and ``[DONE]``."""
        out = ReplyStream(plan, header)
        try:
            try:
                for chunk in out.start():
                    yield _event(chunk)
                async for piece in call.pieces():
                    for chunk in out.add(piece.text, piece.logprobs):
                        yield _event(chunk)
                for chunk in out.end(call.stream.stats):
                    yield _event(chunk)
            except Exception as err:
                yield _event(error_body(500, f"generation failed: {err}", "generation_failed"))
            yield {"data": DONE}
        finally:
            await call.close()


async def _release(lease: CorpusLease | None) -> None:
    """Let go of a corpus, off the loop (the last call of a deleted one removes its branches)."""
    if lease is not None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lease.release)


def _event(payload: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(payload, ensure_ascii=False)}
