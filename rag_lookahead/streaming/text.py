"""Incremental detokenization: text released in chunks as tokens are accepted.

The text is what ``tokenizer.decode(all generated ids, skip_special_tokens=True)`` gives (so
tokenizers that merge across token boundaries stay right). For a byte-level fast tokenizer it
is built step by step with the tokenizer's own incremental decoder (`tokenizers.decoders.
DecodeStream`), which decodes only the last few tokens, rather than decoding the whole answer
again every step. An incomplete UTF-8 character at the end is held back until it is decided;
what else must be held (a tail that could still become a stop string) is `stopping`'s decision.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["TextAssembler", "incremental_backend"]

_FORCED_CLEAN_UP = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"


class TextAssembler:
    """The text of the accepted token ids, and how much of it has been released."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.emitted = 0  # characters of the decoded text already released
        backend = incremental_backend(tokenizer)
        self._decoded = None if backend is None else _DecodedSoFar(backend)
        self._previewed: tuple[tuple[int, ...], _DecodedSoFar] | None = None  # the last preview's

    def preview(self, tokens: Sequence[int]) -> str:
        """The whole text if ``tokens`` were appended (nothing is changed)."""
        if self._decoded is not None:
            extended = self._decoded.extended(tokens)
            self._previewed = (tuple(tokens), extended)  # a commit of the same tokens reuses it
            return extended.text()
        return str(self.tokenizer.decode(self.token_ids + list(tokens), skip_special_tokens=True))

    def complete_end(self, text: str) -> int:
        """End of ``text`` before a trailing incomplete multi-byte character."""
        end = len(text)
        while end > self.emitted and text[end - 1] == "\ufffd":
            end -= 1
        return end

    def commit(self, tokens: Sequence[int], text: str, end: int) -> str:
        """Append ``tokens`` (whose whole text is ``text``); release it up to ``end``."""
        self.token_ids += list(tokens)
        if self._decoded is not None:
            previewed, self._previewed = self._previewed, None
            if previewed is not None and previewed[0] == tuple(tokens):
                self._decoded = previewed[1]
            else:
                self._decoded = self._decoded.extended(tokens)
        chunk = text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return chunk

    def flush(self) -> str:
        """The text held back, released at the end of generation."""
        text = self.preview(())
        chunk = text[self.emitted :]
        self.emitted = len(text)
        return chunk


def incremental_backend(tokenizer: Any) -> Any | None:
    """The `tokenizers.Tokenizer` whose `DecodeStream` gives exactly ``tokenizer.decode``'s
    text, else ``None`` (the text is then decoded whole every step).

    Only a stock transformers fast tokenizer (its ``decode`` not overridden) with a byte-level
    decoder and no clean-up of spaces: byte-level decoding is local (the bytes of every token,
    joined, read as UTF-8), so the text of the last tokens after a complete character is all a
    stream needs. Others keep the whole decode: the clean-up of spaces (applied by transformers
    after decoding) and a byte-fallback decoder (whose invalid byte run turns earlier, already
    complete bytes into U+FFFD) change text before the last tokens.
    """
    try:
        from transformers import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    # Not overridden, by a subclass or on the object itself.
    stock = (
        isinstance(tokenizer, TokenizersBackend)
        and getattr(tokenizer.decode, "__func__", None) is PreTrainedTokenizerBase.decode
        and getattr(tokenizer._decode, "__func__", None) is TokenizersBackend._decode
    )
    backend: Any = tokenizer.backend_tokenizer if stock else None
    if backend is None or type(backend.decoder).__name__ != "ByteLevel":
        return None
    # transformers' own rule for when `_decode` cleans up spaces (never for BPE unless forced).
    bpe, forced = type(backend.model).__name__ == "BPE", getattr(tokenizer, _FORCED_CLEAN_UP, False)
    cleans = bool(tokenizer.clean_up_tokenization_spaces) and (not bpe or forced)
    return None if cleans else backend


@dataclass(frozen=True)
class _DecodedSoFar:
    """The text of some token ids, kept as `DecodeStream` builds it (immutable: `extended`
    returns a new one, so that a preview leaves the committed state as it was)."""

    backend: Any
    stream: Any = None
    complete: str = ""  # the text up to the stream's last chunk, which ends in a whole character
    context: tuple[int, ...] = ()  # the ids of that last chunk: the stream decodes after them
    pending: tuple[int, ...] = ()  # ids since, whose text is not complete yet

    def extended(self, tokens: Sequence[int]) -> _DecodedSoFar:
        if not tokens:
            return self
        from tokenizers.decoders import DecodeStream

        stream = DecodeStream(skip_special_tokens=True) if self.stream is None else copy.copy(self.stream)
        complete, context, pending = self.complete, self.context, self.pending
        for token in tokens:
            chunk = stream.step(self.backend, int(token))
            if chunk is None:
                pending += (int(token),)
            else:  # the stream's own rule: its window is now the ids of this chunk
                complete, context, pending = complete + chunk, (*pending, int(token)), ()
        return _DecodedSoFar(self.backend, stream, complete, context, pending)

    def text(self) -> str:
        """The whole text: the complete part and the pending ids' text after their context."""
        if not self.pending:
            return self.complete
        before = self.backend.decode(list(self.context), skip_special_tokens=True)
        after = self.backend.decode([*self.context, *self.pending], skip_special_tokens=True)
        return self.complete + after[len(before) :]
