"""The streaming primitive: text chunks out of the engine's token steps, with stats at the end."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Collection, Generator, Iterator, NamedTuple

from rag_lookahead.stats import DecodeStats, FinishReason
from rag_lookahead.text import TextAssembler

__all__ = ["Chunk", "Completion", "StepRecorder", "TextStream", "truncate_step"]


class Chunk(NamedTuple):
    """What one decoding step released: its token ids and the text they complete."""

    token_ids: list[int]
    text: str


@dataclass
class StepRecorder:
    """Mutable per-call measurements, frozen into `DecodeStats` on demand."""

    prompt_tokens: int
    started: float = field(default_factory=time.perf_counter)
    prefill_seconds: float = 0.0
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    new_tokens: int = 0
    finish_reason: FinishReason | None = None
    ended: float | None = None

    def step(self, drafted: int, accepted: int, source: str) -> None:
        self.drafted.append(drafted)
        self.accepted.append(accepted)
        self.sources.append(source)

    def finish(self, reason: FinishReason, *, override: bool = False) -> None:
        """Record why generation ended; the first reason stands unless ``override``."""
        if self.finish_reason is None or override:
            self.finish_reason = reason
            self.ended = time.perf_counter()

    def stats(self) -> DecodeStats:
        end = self.ended if self.ended is not None else time.perf_counter()
        return DecodeStats(
            prompt_tokens=self.prompt_tokens,
            new_tokens=self.new_tokens,
            steps=len(self.accepted),
            accepted_per_step=tuple(self.accepted),
            drafted_per_step=tuple(self.drafted),
            draft_sources=tuple(self.sources),
            prefill_seconds=self.prefill_seconds,
            seconds=end - self.started,
            finish_reason=self.finish_reason or "abandoned",
        )


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

    def __init__(
        self,
        steps: Generator[list[int], None, None],
        assembler: TextAssembler,
        recorder: StepRecorder,
    ) -> None:
        self._steps = steps
        self._assembler = assembler
        self._recorder = recorder
        self._closed = False
        self._chunks = self._run()
        self.text = ""

    @property
    def token_ids(self) -> list[int]:
        """New token ids released so far (EOS and a stop string's tokens included)."""
        return self._assembler.token_ids

    @property
    def stats(self) -> DecodeStats:
        return self._recorder.stats()

    def chunks(self) -> Iterator[Chunk]:
        """The same stream as (token ids, text) pairs, one per decoding step."""
        return self._chunks

    def _run(self) -> Iterator[Chunk]:
        while not self._closed:
            try:
                tokens = next(self._steps)
            except StopIteration:
                tail = self._assembler.flush()
                self.close()
                if tail:
                    self.text += tail
                    yield Chunk([], tail)
                return
            kept, text = self._assembler.push(tokens)
            self._recorder.new_tokens += len(kept)
            self.text += text
            if self._assembler.stopped:
                # The text ends at the stop string even when the same step also held an EOS
                # or reached the token budget further on.
                self._recorder.finish("stop_string", override=True)
                self.close()
            yield Chunk(kept, text)

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        for chunk in self._chunks:
            if chunk.text:
                return chunk.text
        raise StopIteration

    def close(self) -> None:
        """Stop generating; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._recorder.finish("abandoned")
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


def truncate_step(
    tokens: list[int], eos: Collection[int], remaining: int
) -> tuple[list[int], FinishReason | None]:
    """Cut a step's tokens after the first EOS or at the token budget."""
    for i, token in enumerate(tokens[:remaining]):
        if token in eos:
            return tokens[: i + 1], "eos"
    if len(tokens) >= remaining:
        return tokens[:remaining], "length"
    return tokens, None
