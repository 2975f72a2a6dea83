"""The streaming primitive: text chunks out of the engine's decoding steps, stats at the end."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from rag_lookahead.streaming.stats import DecodeStats, StepRecorder

__all__ = ["Completion", "StreamChunk", "TextStream"]


class StreamChunk(NamedTuple):
    """What one decoding step released: its token ids and the text they complete."""

    token_ids: list[int]
    text: str


@dataclass(frozen=True)
class Completion:
    """A finished generation: the new text (prompt not echoed), its token ids and stats."""

    text: str
    token_ids: list[int]
    stats: DecodeStats


@dataclass
class _Released:
    """The text and token ids a stream has released so far."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)


class TextStream(Iterator[str]):
    """Iterates the new text chunk by chunk; ``stats`` is final once the stream is exhausted.

    The call holds its trie branches until it ends: when its last token is decided, or when
    the stream is closed — by `close`, by leaving a ``with`` block, by closing `chunks`, or when
    the last reference to the stream goes (nothing here refers back to it, so CPython frees it
    then, not at some later garbage collection). A stream still referenced but never read again
    (a kept traceback) is carried to its end by the engine's other calls as they are read.
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
        self._released = _Released()
        self._closed = False
        # Refers to the steps and what they released, never to this stream: no cycle.
        self._chunks = _iterate(steps, self._released, cancel)

    @property
    def text(self) -> str:
        """New text released so far."""
        return self._released.text

    @property
    def token_ids(self) -> list[int]:
        """New token ids released so far (EOS and a stop string's tokens included)."""
        return self._released.token_ids

    @property
    def stats(self) -> DecodeStats:
        """The call's measurements; ``finish_reason`` is ``None`` while it is still running."""
        stats = self._recorder.stats()
        if stats.finish_reason is None and self._closed:  # closed before it started
            stats = replace(stats, finish_reason="abandoned")
        return stats

    def chunks(self) -> Generator[StreamChunk, None, None]:
        """The same stream as (token ids, text) pairs, one per decoding step; closing this
        generator closes the stream."""
        return self._chunks

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        for chunk in self._chunks:
            if chunk.text:
                return chunk.text
        raise StopIteration

    def close(self) -> None:
        """Stop generating and release what the call holds; idempotent."""
        if not self._closed:
            self._closed = True
            self._chunks.close()
            self._steps.close()
            if self._cancel is not None:  # also a call whose chunks were never read
                self._cancel()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def complete(self) -> Completion:
        """Run to the end and return the whole completion."""
        for _ in self._chunks:
            pass
        return Completion(self.text, list(self.token_ids), self.stats)


def _iterate(
    steps: Generator[StreamChunk, None, None], released: _Released, cancel: Callable[[], None] | None
) -> Generator[StreamChunk, None, None]:
    try:
        for chunk in steps:
            released.token_ids += chunk.token_ids
            released.text += chunk.text
            yield chunk
    finally:
        steps.close()  # a consumer that stopped early ends generation here
        if cancel is not None:
            cancel()
