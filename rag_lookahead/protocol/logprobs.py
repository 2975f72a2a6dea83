"""Log probabilities in OpenAI's shapes: a chat's ``{"content": [...]}`` and a completion's
legacy ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag_lookahead.protocol.requests import CallKind
from rag_lookahead.streaming.logprobs import TokenLogprob

__all__ = ["LogprobsOut", "openai_logprobs"]


def openai_logprobs(kind: CallKind, items: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """``items`` as a choice's ``logprobs``; a completion's ``text_offset`` counts from
    ``offset`` (the characters of its text before them), each token's own text long."""
    if kind == "chat":
        return {"content": [item.to_openai() for item in items]}
    offsets = []
    for item in items:
        offsets.append(offset)
        offset += len(item.token)
    return {
        "tokens": [item.token for item in items],
        "token_logprobs": [item.finite_logprob for item in items],
        # As OpenAI's legacy API: the most likely tokens, and the chosen one among them.
        "top_logprobs": [
            {**{t.token: t.finite_logprob for t in item.top_logprobs}, item.token: item.finite_logprob}
            for item in items
        ],
        "text_offset": offsets,
    }


class LogprobsOut:
    """A streamed reply's log probabilities: `add` what each step released, `take` what the
    next chunk carries (everything added since, ``None`` when the call did not ask)."""

    def __init__(self, kind: CallKind, asked: bool) -> None:
        self._kind = kind
        self._asked = asked
        self._pending: list[TokenLogprob] = []
        self._offset = 0

    def add(self, items: Sequence[TokenLogprob] | None) -> None:
        if items:
            self._pending += items

    def take(self) -> dict[str, Any] | None:
        if not self._asked or not self._pending:
            return None
        items, self._pending = self._pending, []
        shape = openai_logprobs(self._kind, items, self._offset)
        self._offset += sum(len(item.token) for item in items)
        return shape
