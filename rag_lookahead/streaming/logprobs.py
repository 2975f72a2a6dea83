"""The log probabilities of released tokens (``logprobs=True`` on a call).

Each is the model's raw distribution at that position: the log-softmax of its logits in fp32,
before the repetition penalty, temperature, top-k/top-p or a grammar's mask shape the choice
(vLLM's default, and what OpenAI's API reports). So a token a grammar forced may be unlikely,
and a sampled call reports the same numbers as a greedy one would at the same prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_TOP_LOGPROBS", "TokenLogprob", "token_logprobs"]

# OpenAI's bound on ``top_logprobs`` (and vLLM's default one).
MAX_TOP_LOGPROBS = 20
# What a zero probability reads as in OpenAI's shapes (JSON has no -inf), as vLLM writes it.
_LEAST_LOGPROB = -9999.0


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log probability, and the most likely tokens at its position.

    Attributes:
        token: The token's own text (``tokenizer.decode([token_id])``; a token that holds part
            of a character reads as U+FFFD, as in vLLM).
        logprob: Its natural log probability under the model's raw distribution.
        token_id: Its id, or ``None`` where a remote server gave text only.
        top_logprobs: The ``top_logprobs`` most likely tokens there, most likely first (their
            own ``top_logprobs`` are empty).
    """

    token: str
    logprob: float
    token_id: int | None = None
    top_logprobs: tuple[TokenLogprob, ...] = ()

    @property
    def bytes(self) -> list[int]:
        """The UTF-8 bytes of ``token``, as OpenAI's ``bytes``."""
        return list(self.token.encode("utf-8", errors="replace"))

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's chat shape: ``{"token", "logprob", "bytes", "top_logprobs": [...]}``."""
        return {
            "token": self.token,
            "logprob": self.finite_logprob,
            "bytes": self.bytes,
            "top_logprobs": [
                {"token": t.token, "logprob": t.finite_logprob, "bytes": t.bytes} for t in self.top_logprobs
            ],
        }

    @property
    def finite_logprob(self) -> float:
        """``logprob``, with a zero probability (-inf) as -9999.0: what JSON can carry."""
        return max(self.logprob, _LEAST_LOGPROB)


def token_logprobs(
    text: Callable[[int], str],
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    top: Sequence[Sequence[tuple[int, float]]],
) -> list[TokenLogprob]:
    """`TokenLogprob`s of ``token_ids`` with their ``logprobs`` and ``top`` (id, logprob)
    pairs; ``text`` gives a token id's own text."""
    return [
        TokenLogprob(text(t), lp, t, tuple(TokenLogprob(text(i), v, i) for i, v in best))
        for t, lp, best in zip(token_ids, logprobs, top, strict=True)
    ]
