"""The streaming primitive: text chunks out of the engine's decoding steps, stats at the end."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from rag_lookahead.streaming.logprobs import TokenLogprob
from rag_lookahead.streaming.stats import DecodeStats, StepRecorder

__all__ = ["Completion", "StreamChunk", "TextStream"]


@dataclass(frozen=True)
class StreamChunk:
    """What one decoding step released: its token ids, the text they complete, and (for a call
    with ``logprobs=True``) one `TokenLogprob` per token id.

    It unpacks and indexes as the ``(token_ids, text)`` pair it used to be, so that code
    written for the pair keeps working; ``logprobs`` is read by name.
    """

    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None

    def __iter__(self) -> Iterator[Any]:
        return iter((self.token_ids, self.text))

    def __getitem__(self, index: int) -> Any:
        return (self.token_ids, self.text)[index]

    def __len__(self) -> int:
        return 2


@dataclass(frozen=True)
class Completion:
    """A finished generation: the new text (prompt not echoed), its token ids and stats, and
    for a call with ``logprobs=True`` one `TokenLogprob` per token id (else ``None``)."""

    text: str
    token_ids: list[int]
    stats: DecodeStats
    logprobs: list[TokenLogprob] | None = None


@dataclass
class _ReadSoFar:
    """The text, token ids and log probabilities (if asked for) a stream has released so far."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None


class TextStream(Iterator[str]):
    """Iterates the new text chunk by chunk; ``stats`` is final once the stream is exhausted.

    The call holds its trie branches until it ends: when its last token is decided, or when
    the stream is closed — by `close` (from any thread, also while another thread reads it:
    a web handler's disconnect), `aclose`, leaving a ``with`` block, closing `chunks`, or when
    the last reference to the stream goes (nothing here refers back to it, so CPython frees it
    then, not at some later garbage collection). A reader whose stream is closed under it gets
    what was already decided, then the iteration ends. A stream still referenced but never
    read again (a kept traceback) is carried to its end by the engine's other calls as they
    are read. ``async for`` reads it without blocking an event loop.
    """

    def __init__(
        self,
        steps: Generator[StreamChunk, None, None],
        recorder: StepRecorder,
        cancel: Callable[[], None] | None = None,
    ) -> None:
        self._steps = steps
        self._recorder = recorder
        self._cancel = cancel
        self._released = _ReadSoFar()
        self._closed = False
        self._reading = threading.Lock()  # held by the thread advancing the steps
        if cancel is not None:
            # A stream dropped, read or not, ends its call there and then: CPython frees it at
            # once (``cancel`` must not refer to the steps or the stream).
            weakref.finalize(steps, cancel).atexit = False

    @property
    def text(self) -> str:
        """New text released so far."""
        return self._released.text

    @property
    def token_ids(self) -> list[int]:
        """New token ids released so far (EOS and a stop string's tokens included)."""
        return self._released.token_ids

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        """One `TokenLogprob` per released token id, for a call with ``logprobs=True`` (else
        ``None``); the text of a step held back (a possible stop string) may come later than
        its tokens' log probabilities."""
        return self._released.logprobs

    @property
    def stats(self) -> DecodeStats:
        """The call's measurements; ``finish_reason`` is ``None`` while it is still running."""
        stats = self._recorder.stats()
        if stats.finish_reason is None and self._closed:  # closed before it started
            stats = replace(stats, finish_reason="abandoned")
        return stats

    def chunks(self) -> Iterator[StreamChunk]:
        """The same stream as (token ids, text) pairs, one per decoding step; closing this
        iterator closes the stream."""
        return _Chunks(self)

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        while True:
            chunk = self._next_chunk()
            if chunk.text:
                return chunk.text

    def __aiter__(self) -> AsyncIterator[str]:
        from rag_lookahead.streaming.aio import aiterate

        return aiterate(self)

    def close(self) -> None:
        """Stop generating and release what the call holds, from any thread; idempotent. Returns
        once the call has ended (at most one decoding step later)."""
        if self._closed:
            return
        self._closed = True
        if self._reading.acquire(blocking=False):  # else a reader holds it: the call's end ends it
            try:
                self._steps.close()
            finally:
                self._reading.release()
        if self._cancel is not None:  # also a call whose chunks were never read
            self._cancel()

    async def aclose(self) -> None:
        """`close` without blocking the event loop, also while another task reads the stream."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def complete(self) -> Completion:
        """Run to the end and return the whole completion."""
        for _ in self.chunks():
            pass
        logprobs = self.logprobs
        return Completion(
            self.text, list(self.token_ids), self.stats, None if logprobs is None else list(logprobs)
        )

    def _next_chunk(self) -> StreamChunk:
        """The next step's chunk (`StopIteration` at the end), read by one thread at a time."""
        with self._reading:
            try:
                chunk = next(self._steps)
            except StopIteration:
                pass
            except Exception:
                if not self._closed:
                    self._end()
                    raise
                # Closed under its reader (a server's response, say): the close ended it.
            else:
                self._released.token_ids += chunk.token_ids
                self._released.text += chunk.text
                if chunk.logprobs is not None:
                    self._released.logprobs = self._released.logprobs or []
                    self._released.logprobs += chunk.logprobs
                return chunk
        self._end()
        raise StopIteration

    def _end(self) -> None:
        if self._cancel is not None:  # nothing to stop once the call has ended
            self._cancel()


class _Chunks(Iterator[StreamChunk]):
    """A stream's chunks; refers to the stream, never the other way round (no cycle)."""

    def __init__(self, stream: TextStream) -> None:
        self._stream = stream

    def __iter__(self) -> _Chunks:
        return self

    def __next__(self) -> StreamChunk:
        return self._stream._next_chunk()

    def close(self) -> None:
        self._stream.close()
