"""Incremental detokenization with exact stop strings.

Text is decoded from all generated ids (so tokenizers that merge across token boundaries stay
right) and released in chunks. A tail that could still become a stop string, or an incomplete
UTF-8 character, is held back until it is decided.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["TextAssembler"]


class TextAssembler:
    """Turns accepted token ids into text chunks; finds stop strings at token granularity."""

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.token_ids: list[int] = []
        self.emitted = 0  # characters of the decoded text already released
        self.stopped = False

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, tokens: Sequence[int]) -> tuple[list[int], str]:
        """Add a step's tokens; return those kept (cut after a stop string) and new text."""
        text = self._decode(self.token_ids + list(tokens))
        kept = list(tokens)
        stop_at = self._find_stop(text)
        if stop_at is not None:
            kept = list(tokens[: self._stop_token(tokens)])
            self.stopped = True
            text = text[:stop_at]
        self.token_ids += kept
        end = len(text) if self.stopped else self._safe_end(text)
        chunk = text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return list(kept), chunk

    def flush(self) -> str:
        """Text held back at the end of generation."""
        if self.stopped:
            return ""
        text = self._decode(self.token_ids)
        chunk = text[self.emitted :]
        self.emitted = len(text)
        return chunk

    def _find_stop(self, text: str) -> int | None:
        # Released text never ends in a stop string's prefix, so no stop starts before it.
        hits = [i for s in self.stop_strings if (i := text.find(s, self.emitted)) != -1]
        return min(hits) if hits else None

    def _stop_token(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` to keep: up to the one that completes the first stop string."""
        for n in range(1, len(tokens)):
            prefix = self._decode(self.token_ids + list(tokens[:n]))
            if any(s in prefix for s in self.stop_strings):
                return n
        return len(tokens)

    def _safe_end(self, text: str) -> int:
        """End of the text that can be released now."""
        end = len(text)
        while end > self.emitted and text[end - 1] == "\ufffd":  # incomplete multi-byte char
            end -= 1
        held = 0
        for stop in self.stop_strings:
            for k in range(min(len(stop) - 1, end - self.emitted), held, -1):
                if text[end - k : end] == stop[:k]:
                    held = k
                    break
        return end - held
