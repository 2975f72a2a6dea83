"""OpenAI's legacy ``echo`` on a completion: the prompt comes back before the answer.

With ``logprobs``, the prompt's tokens come first in the choice's ``logprobs`` (the legacy shape
of `openai_logprobs`): the first token's log probability and top tokens are ``null``, since
nothing before it predicts it; the answer's tokens follow, their ``text_offset`` counted in the
echoed text. This is what lm-eval's ``local-completions`` reads for its loglikelihood requests
(``echo: true``, ``logprobs: 1``, ``max_tokens`` 0 or 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rag_lookahead.protocol.logprobs import openai_logprobs
from rag_lookahead.streaming.logprobs import TokenLogprob

__all__ = ["Echo", "echoed"]

_LISTS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


@dataclass(frozen=True)
class Echo:
    """A prompt as a reply echoes it.

    Attributes:
        text: The prompt's text: as sent, or its token ids decoded.
        prompt_tokens: Its length in tokens.
        logprobs: Its tokens' log probabilities in the legacy shape (the first ``null``), or
            ``None`` when the call did not ask for them.
    """

    text: str
    prompt_tokens: int
    logprobs: dict[str, Any] | None = None

    @classmethod
    def scored(cls, text: str, first_token: str, scored: Sequence[TokenLogprob]) -> Echo:
        """The echo of ``text`` whose first token reads ``first_token`` and whose later tokens
        are ``scored`` (each with its log probability given the tokens before it)."""
        rest = openai_logprobs("completion", scored, len(first_token))
        shape = {
            "tokens": [first_token, *rest["tokens"]],
            "token_logprobs": [None, *rest["token_logprobs"]],
            "top_logprobs": [None, *rest["top_logprobs"]],
            "text_offset": [0, *rest["text_offset"]],
        }
        return cls(text, len(scored) + 1, shape)


def echoed(reply: dict[str, Any], echo: Echo) -> dict[str, Any]:
    """A completion's whole ``reply`` (from `reply`) with ``echo`` before its text: the prompt's
    log probabilities before the answer's, whose offsets move past the echoed text."""
    choice = dict(reply["choices"][0])
    choice["text"] = echo.text + choice["text"]
    answer = choice.get("logprobs")
    if echo.logprobs is not None and answer is not None:
        moved = {**answer, "text_offset": [offset + len(echo.text) for offset in answer["text_offset"]]}
        choice["logprobs"] = {key: echo.logprobs[key] + moved[key] for key in _LISTS}
    return {**reply, "choices": [choice, *reply["choices"][1:]]}
