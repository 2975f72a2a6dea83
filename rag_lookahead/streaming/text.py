"""Incremental detokenization: text released in chunks as tokens are accepted.

Text is decoded from all generated ids (so tokenizers that merge across token boundaries stay
right). An incomplete UTF-8 character at the end is held back until it is decided; what else
must be held (a tail that could still become a stop string) is `stopping`'s decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["TextAssembler"]


class TextAssembler:
    """The text of the accepted token ids, and how much of it has been released."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.emitted = 0  # characters of the decoded text already released

    def preview(self, tokens: Sequence[int]) -> str:
        """The whole text if ``tokens`` were appended (nothing is changed)."""
        return self.tokenizer.decode(self.token_ids + list(tokens), skip_special_tokens=True)

    def complete_end(self, text: str) -> int:
        """End of ``text`` before a trailing incomplete multi-byte character."""
        end = len(text)
        while end > self.emitted and text[end - 1] == "\ufffd":
            end -= 1
        return end

    def commit(self, tokens: Sequence[int], text: str, end: int) -> str:
        """Append ``tokens`` (whose whole text is ``text``); release it up to ``end``."""
        self.token_ids += list(tokens)
        chunk = text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return chunk

    def flush(self) -> str:
        """The text held back, released at the end of generation."""
        text = self.preview(())
        chunk = text[self.emitted :]
        self.emitted = len(text)
        return chunk
