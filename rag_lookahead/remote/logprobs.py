"""A server's log probabilities, read off its stream and released with the text they begin in.

The server sends them per chunk, in OpenAI's chat shape (``logprobs.content``) or the legacy
completion one (``logprobs.tokens`` ...). The text this client releases may be cut short of
what the server sent (a stop string found here, the length bound): a token is released once
the released text reaches where it begins, and those that begin past the end are dropped. A
token's place is the length of the tokens' texts before it, which is the server's text as long
as its tokens' texts add up to it (a token holding part of a character may not).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rag_lookahead.streaming.logprobs import TokenLogprob

__all__ = ["ServerLogprobs", "choice_logprobs"]


def choice_logprobs(choice: Any) -> list[TokenLogprob]:
    """The log probabilities of a streamed choice's tokens (none where it has none); a shape
    that is neither OpenAI's chat nor its legacy completion one is a `ValueError`."""
    logprobs = getattr(choice, "logprobs", None)
    if logprobs is None:
        return []
    content = getattr(logprobs, "content", None)
    if content is not None:
        return [_chat_item(item) for item in content]
    tokens = getattr(logprobs, "tokens", None)
    if tokens is None:
        return []
    values = getattr(logprobs, "token_logprobs", None) or []
    tops = getattr(logprobs, "top_logprobs", None) or [{}] * len(tokens)
    if not (len(tokens) == len(values) == len(tops)):
        raise ValueError("its legacy logprobs lists differ in length")
    return [_legacy_item(t, v, top) for t, v, top in zip(tokens, values, tops, strict=True)]


def _chat_item(item: Any) -> TokenLogprob:
    top = tuple(
        TokenLogprob(_text(getattr(t, "token", None)), _number(getattr(t, "logprob", None)))
        for t in getattr(item, "top_logprobs", None) or ()
    )
    return TokenLogprob(
        _text(getattr(item, "token", None)), _number(getattr(item, "logprob", None)), None, top
    )


def _legacy_item(token: object, value: object, top: object) -> TokenLogprob:
    if not isinstance(top, Mapping):
        raise ValueError(f"a legacy top_logprobs entry is an object, got {top!r}")
    best = sorted(((_text(t), _number(v)) for t, v in top.items()), key=lambda pair: -pair[1])
    return TokenLogprob(_text(token), _number(value), None, tuple(TokenLogprob(t, v) for t, v in best))


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"a logprobs token is a string, got {value!r}")
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"a logprob is a number, got {value!r}")
    return float(value)


class ServerLogprobs:
    """One answer's log probabilities: `add` each chunk's, `release` those the text reached."""

    def __init__(self) -> None:
        self._pending: list[tuple[int, TokenLogprob]] = []  # (where its text begins, it)
        self._received = 0

    def add(self, items: list[TokenLogprob]) -> None:
        for item in items:
            self._pending.append((self._received, item))
            self._received += len(item.token)

    def release(self, released_chars: int, everything: bool) -> list[TokenLogprob]:
        """Those that begin within the first ``released_chars`` of the text (all of them when
        the answer ended as the server sent it: ``everything``)."""
        if everything:
            count = len(self._pending)
        else:
            count = next(
                (i for i, (start, _) in enumerate(self._pending) if start >= released_chars),
                len(self._pending),
            )
        released = [item for _, item in self._pending[:count]]
        del self._pending[:count]
        return released
