"""A reply's text as it streams, when it may end in tool calls.

What is surely content shows at once; from where a call may begin (`ToolFormat.content_end`)
the text is held back and parsed when the reply ends, so that a streamed reply says what the
whole one says. A server's chunks and an adapter's message chunks are both read off it.
"""

from __future__ import annotations

from rag_lookahead.structured import ParsedReply, ToolFormat

__all__ = ["HeldReply"]


class HeldReply:
    """One reply's text: `add` each piece as it comes, then `end` once.

    Args:
        fmt: The model's tool format when the reply is parsed for calls; ``None`` shows all.
    """

    def __init__(self, fmt: ToolFormat | None) -> None:
        self._format = fmt
        self._text = ""
        self._shown = 0

    @property
    def shown_text(self) -> str:
        """The content shown so far."""
        return self._text[: self._shown]

    def add(self, text: str) -> str:
        """The content ``text`` lets show now (``""`` while it is held back)."""
        self._text += text
        end = len(self._text) if self._format is None else self._format.content_end(self._text)
        if end <= self._shown:
            return ""
        piece, self._shown = self._text[self._shown : end], end
        return piece

    def end(self) -> ParsedReply:
        """What was held back, parsed: its calls and the content around them, or all of it as
        content when it opens no call. A block that does not parse is in ``invalid``."""
        rest = self._text[self._shown :]
        parsed = self._format.parse(rest) if self._format is not None and rest else None
        if parsed is None or not (parsed.calls or parsed.invalid):
            return ParsedReply(rest)
        return parsed
