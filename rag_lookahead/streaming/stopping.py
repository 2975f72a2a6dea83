"""When a call stops, decided in one place: EOS, stop strings, the token budget, the context window.

Each step's accepted tokens pass through `Stopping.release`, which cuts them where generation
ends and turns the kept ones into released text. A stop string is matched in the decoded text
(it may span tokens, or end inside one); text that could still become a stop string is held
back until the next step decides it. When one step holds several reasons, the text ends at the
stop string, so ``"stop_string"`` wins over an EOS or the budget further on.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

from rag_lookahead.streaming.stats import FinishReason
from rag_lookahead.streaming.text import TextAssembler

__all__ = ["Released", "Stopping", "find_stop", "held_back", "truncate_step"]


class Released(NamedTuple):
    """What one step released: the tokens kept, their new text, and why the call ends (if it does)."""

    token_ids: list[int]
    text: str
    reason: FinishReason | None


class Stopping:
    """The stopping state of one call."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        eos: Collection[int],
        stop_strings: Sequence[str],
        max_new_tokens: int,
        prompt_length: int,
        context_window: int | None,
    ) -> None:
        self.assembler = TextAssembler(tokenizer)
        self.eos = frozenset(eos)
        self.stop_strings = tuple(stop_strings)
        self.max_new_tokens = max_new_tokens
        self.prompt_length = prompt_length
        self.context_window = context_window if context_window is not None else 1 << 62
        self.generated = 0

    def room(self) -> int:
        """Most tokens the next step may emit: the budget left, and the context window's room."""
        return min(self.max_new_tokens - self.generated, self.context_room())

    def context_room(self) -> int:
        """Positions left in the context window (the call's one owner of it)."""
        return self.context_window - self.prompt_length - self.generated

    def release(self, tokens: Sequence[int]) -> Released:
        """Cut a step's ``tokens`` where generation ends and release their text."""
        kept, reason = truncate_step(list(tokens), self.eos, self.max_new_tokens - self.generated)
        asm = self.assembler
        text = asm.preview(kept)
        stop_at = self._find_stop(text)
        if stop_at is not None:
            kept = kept[: self._stop_token(kept)]
            text, end, reason = text[:stop_at], stop_at, "stop_string"
        else:
            end = asm.complete_end(text)
            end -= self._held(text, end)
        self.generated += len(kept)
        if reason is None and self.prompt_length + self.generated >= self.context_window:
            reason = "context_window"
        chunk = asm.commit(kept, text, end)
        if reason is not None and reason != "stop_string":
            chunk += asm.flush()
        return Released(kept, chunk, reason)

    def _find_stop(self, text: str) -> int | None:
        # Released text never ends in a stop string's prefix, so no stop starts before it.
        return find_stop(text, self.stop_strings, self.assembler.emitted)

    def _stop_token(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` to keep: up to the one that completes the first stop string."""
        for n in range(1, len(tokens)):
            if self._find_stop(self.assembler.preview(tokens[:n])) is not None:
                return n
        return len(tokens)

    def _held(self, text: str, end: int) -> int:
        """Characters before ``end`` that could still begin a stop string."""
        return held_back(text, self.stop_strings, self.assembler.emitted, end)


def find_stop(text: str, stop_strings: Sequence[str], start: int = 0) -> int | None:
    """Where the first stop string found in ``text`` from ``start`` on begins, if any does."""
    hits = [i for s in stop_strings if (i := text.find(s, start)) != -1]
    return min(hits) if hits else None


def held_back(text: str, stop_strings: Sequence[str], start: int, end: int) -> int:
    """How many characters of ``text[start:end]``, at its end, could still begin a stop string:
    they are held back until the text that follows decides."""
    held = 0
    for stop in stop_strings:
        for k in range(min(len(stop) - 1, end - start), held, -1):
            if text[end - k : end] == stop[:k]:
                held = k
                break
    return held


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
