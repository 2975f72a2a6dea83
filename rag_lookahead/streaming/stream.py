"""The streaming primitive: text chunks out of the engine's decoding steps, stats at the end."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
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


class TextStream(Iterator[str]):
    """Iterates the new text chunk by chunk; ``stats`` is final once the stream is exhausted.

    Leaving the loop early is fine: `close` (also called by ``with`` and on garbage collection)
    ends generation and releases what it held, such as the query's trie branches.
    """

    def __init__(self, steps: Generator[StreamChunk, None, None], recorder: StepRecorder) -> None:
        self._steps = steps
        self._recorder = recorder
        self._closed = False
        self._token_ids: list[int] = []
        self._chunks = self._iterate()
        self.text = ""

    @property
    def token_ids(self) -> list[int]:
        """New token ids released so far (EOS and a stop string's tokens included)."""
        return self._token_ids

    @property
    def stats(self) -> DecodeStats:
        return self._recorder.stats()

    def chunks(self) -> Generator[StreamChunk, None, None]:
        """The same stream as (token ids, text) pairs, one per decoding step; closing this
        generator closes the stream."""
        return self._chunks

    def _iterate(self) -> Generator[StreamChunk, None, None]:
        try:
            for chunk in self._steps:
                self._token_ids += chunk.token_ids
                self.text += chunk.text
                yield chunk
        finally:
            self.close()

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
            self._steps.close()  # runs the engine's cleanup

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_closed"):
            self.close()

    def complete(self) -> Completion:
        """Run to the end and return the whole completion."""
        for _ in self.chunks():
            pass
        return Completion(self.text, list(self.token_ids), self.stats)
