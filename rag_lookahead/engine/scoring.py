"""A prompt scored by the model: each token's log probability given the tokens before it.

What OpenAI's legacy ``echo`` with ``logprobs`` reports, and what an evaluation harness's
loglikelihood requests read (lm-eval's ``local-completions``). The prompt runs through the
model in one causal pass (in chunks of at most `SCORE_CHUNK` tokens, over the model's own KV
cache, so that a long prompt's logits never fill memory at once); each position's log-softmax is
taken in fp32 over the raw logits, as the log probabilities of generated tokens are (see
`rag_lookahead.streaming.logprobs`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rag_lookahead.decoding.verify import raw_logprobs
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.streaming.logprobs import MAX_TOP_LOGPROBS, TokenLogprob, token_logprobs

__all__ = ["SCORE_CHUNK", "PromptLogprobs", "check_top", "prompt_logprobs", "score_tokens"]

# Tokens per forward: bounds the fp32 logits a forward leaves ([SCORE_CHUNK, V]).
SCORE_CHUNK = 256


@dataclass(frozen=True)
class PromptLogprobs:
    """A prompt's tokens and their log probabilities under the model.

    Attributes:
        token_ids: The prompt's token ids, as the model read them.
        first_token: The first token's own text: nothing before it predicts it, so it has no
            log probability (OpenAI's ``null``).
        logprobs: Each later token's log probability given the tokens before it, with the
            most likely tokens at its position (``len(token_ids) - 1`` of them).
    """

    token_ids: tuple[int, ...]
    first_token: str
    logprobs: tuple[TokenLogprob, ...]


def check_top(top: object) -> int:
    """``top`` (the most likely tokens reported at each position), once it is an integer from
    0 to `MAX_TOP_LOGPROBS`."""
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {top!r}")
    return top


def score_tokens(
    runner: ModelRunner, ids: Sequence[int], top: int, chunk: int = SCORE_CHUNK
) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """The log probability of each of ``ids[1:]`` given the ids before it, and the ``top``
    most likely (id, log probability) pairs at its position, best first.

    The model's forwards over the prompt: the one function here that runs the model."""
    chosen: list[float] = []
    best: list[list[tuple[int, float]]] = []
    cache = None  # the model's own cache: these forwards are plain causal ones
    last = len(ids) - 1  # the last token predicts nothing of the prompt: it is not run
    for start in range(0, last, chunk):
        end = min(start + chunk, last)
        logits, cache = runner.forward(torch.tensor([list(ids[start:end])]), cache)  # [end - start, V]
        values, pairs = raw_logprobs(logits, ids[start + 1 : end + 1], top)
        chosen += values
        best += pairs
    return chosen, best


def prompt_logprobs(
    runner: ModelRunner, text: Callable[[int], str], ids: Sequence[int], top: int
) -> PromptLogprobs:
    """``ids`` scored by ``runner``'s model (`score_tokens`), ``text`` giving a token's own text."""
    if not ids:
        raise ValueError("the prompt is empty")
    chosen, best = score_tokens(runner, ids, check_top(top))
    return PromptLogprobs(tuple(ids), text(ids[0]), tuple(token_logprobs(text, ids[1:], chosen, best)))
