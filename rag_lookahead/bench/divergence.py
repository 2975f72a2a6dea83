"""Where an answer leaves greedy decoding's, and how near a tie greedy's choice was there.

A forward over a draft tree (or a batch) rounds differently from ``generate``'s one-token
forwards — far less in fp32 than in bf16 or fp16 — so where two tokens' logits nearly tie, the
other one can win, for any speculative method. What tells such a near-tie from a fault is
``generate``'s own logits at the first token that differs: the margin of greedy's token over
the answer's there: a near-tie's is a few steps of the dtype at that logit (rounding gathered
over the layers), a fault's need not be.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from rag_lookahead.engine import LookaheadEngine

__all__ = ["describe", "divergence", "divergences", "first_difference"]


def first_difference(answer: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first token where ``answer`` and ``reference`` differ (where one is the
    other's beginning, the shorter's length); ``None`` where they are equal."""
    for index, (token, expected) in enumerate(zip(answer, reference, strict=False)):
        if token != expected:
            return index
    return None if len(answer) == len(reference) else min(len(answer), len(reference))


def divergence(
    engine: LookaheadEngine, prompt: Sequence[int], answer: Sequence[int], reference: Sequence[int]
) -> dict[str, Any] | None:
    """Where ``answer`` first leaves ``reference`` (greedy ``generate``'s answer to ``prompt``),
    with ``generate``'s logits there: ``margin``, greedy's token's logit minus the answer's;
    ``rank``, the answer's token's place in them (2: the runner-up); greedy's ``logit`` and the
    ``spacing`` of the model's dtype at it. A margin of a spacing or two is a near-tie of
    rounding; 0 at rank 1 is an exact tie, which ``argmax`` breaks by the lower token id.
    ``None`` where the two are equal. Margin and rank are ``None`` where the answer ended first,
    or where ``generate`` asked again did not repeat its answer (then ``repeated`` is false)."""
    index = first_difference(answer, reference)
    if index is None:
        return None
    token = answer[index] if index < len(answer) else None
    greedy = reference[index] if index < len(reference) else None
    found: dict[str, Any] = {
        "position": index,
        "greedy_token": greedy,
        "token": token,
        "margin": None,
        "rank": None,
    }
    if token is None or greedy is None:
        return found
    logits = _greedy_logits(engine, prompt, reference, index)  # [V]
    if logits is None:
        return {**found, "repeated": False}
    found["margin"] = round(float(logits[greedy] - logits[token]), 6)
    found["rank"] = int((logits > logits[token]).sum()) + 1
    found["logit"] = round(float(logits[greedy]), 6)
    found["spacing"] = _spacing(float(logits[greedy]), engine.model.dtype)
    return found


def divergences(
    engine: LookaheadEngine,
    prompts: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    references: Sequence[Sequence[int]],
) -> list[dict[str, Any]]:
    """`divergence` of every answer that differs from its reference, with its index."""
    found = []
    for index, (prompt, answer, reference) in enumerate(zip(prompts, answers, references, strict=True)):
        where = divergence(engine, prompt, answer, reference)
        if where is not None:
            found.append({"answer": index, **where})
    return found


def describe(method: str, found: Sequence[dict[str, Any]]) -> list[str]:
    """One line per answer of ``method`` that is not greedy's (`divergences`), for a table."""
    lines = []
    for where in found:
        if where["margin"] is None:
            why = "ended first" if where["token"] is None or where["greedy_token"] is None else "not repeated"
            lines.append(
                f"  {method}: answer {where['answer']} leaves greedy's at token {where['position']} ({why})"
            )
        else:
            lines.append(
                f"  {method}: answer {where['answer']} leaves greedy's at token {where['position']}: "
                f"generate's margin {where['margin']:.4g} (spacing {where['spacing']:.4g}), "
                f"its choice ranked {where['rank']}"
            )
    return lines


def _greedy_logits(
    engine: LookaheadEngine, prompt: Sequence[int], reference: Sequence[int], index: int
) -> torch.Tensor | None:
    """``generate``'s logits for greedy's token ``index`` after ``prompt`` as its decoding
    computed them (the prompt's forward, then one-token forwards), as fp32; ``None`` where
    ``generate`` did not answer ``reference`` again."""
    input_ids = torch.tensor([list(prompt)], device=engine.device)

    def generate() -> Any:
        with torch.inference_mode():
            return engine.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=index + 1,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=engine.eos_token_ids[0] if engine.eos_token_ids else None,
            )

    out = engine.runner.thread.call(generate)  # where the engine's forwards ran
    if out.sequences[0, len(prompt) :].tolist() != list(reference[: index + 1]):
        return None  # greedy decoding that does not repeat itself on this device
    return out.logits[index][0].float()  # [V]


def _spacing(value: float, dtype: torch.dtype) -> float:
    """The gap between ``value`` and the next number of ``dtype`` away from zero: how finely
    a logit near ``value`` is rounded in that dtype."""
    if value == 0:
        return float(torch.finfo(dtype).tiny)
    return float(torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(abs(value))))
