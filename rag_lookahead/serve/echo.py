"""A completion that echoes its prompt (``echo: true``): the prompt scored, then the answer.

The prompt's log probabilities come from the engine's `prompt_logprobs` (one causal pass over
the prompt, `rag_lookahead.engine.scoring`), taken under a running slot as any call is; an
engine without it (a remote server) answers 400 when they are asked for. With ``max_tokens: 0``
nothing is generated; else the answer is the call's own, as without ``echo``.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import anyio

from rag_lookahead.interface import Engine
from rag_lookahead.protocol import CallPlan, ReplyHeader, reply
from rag_lookahead.protocol.echo import Echo, echoed
from rag_lookahead.serve.admission import Admission
from rag_lookahead.serve.calls import Caller
from rag_lookahead.serve.errors import ApiError
from rag_lookahead.streaming.stats import DecodeStats

__all__ = ["echo_reply"]


async def echo_reply(
    engine: Engine, admission: Admission, caller: Caller, plan: CallPlan, header: ReplyHeader, started: float
) -> dict[str, Any]:
    """The whole reply to an echoing ``plan``: its prompt (scored when it asks for log
    probabilities), then what it generates (nothing with ``max_tokens: 0``)."""
    echo = await _echo(engine, admission, plan)
    if plan.echo_only:
        answer = reply(plan, header, "", _nothing_generated(echo.prompt_tokens, started), ())
    else:
        answer = await caller.whole(plan, header, started)
    return echoed(answer, echo)


async def _echo(engine: Engine, admission: Admission, plan: CallPlan) -> Echo:
    """The plan's prompt as its reply echoes it; a prompt the engine refuses is HTTP 400."""
    try:
        if plan.params.logprobs:
            return await _scored(engine, admission, plan)
        ids = await anyio.to_thread.run_sync(engine.encode, plan.prompt)
        return Echo(await anyio.to_thread.run_sync(_text, engine, plan.prompt), len(ids))
    except (TypeError, ValueError) as err:
        raise ApiError(400, str(err), code="invalid_request", param="prompt") from None


async def _scored(engine: Engine, admission: Admission, plan: CallPlan) -> Echo:
    """The echo with the prompt's log probabilities: a forward over the prompt, in a slot."""
    score = getattr(engine, "prompt_logprobs", None)
    if score is None:
        raise ApiError(
            400,
            f"echo with logprobs needs the prompt's log probabilities, which only a local engine "
            f"gives ({type(engine).__name__} has none): leave logprobs out to echo the text alone",
            code="unsupported_value",
            param="echo",
        )
    slot = await admission.enter()
    try:
        scored = await anyio.to_thread.run_sync(
            functools.partial(score, plan.prompt, plan.params.top_logprobs)
        )
    finally:
        slot.release()
    text = await anyio.to_thread.run_sync(_text, engine, plan.prompt)
    return Echo.scored(text, scored.first_token, scored.logprobs)


def _text(engine: Engine, prompt: Any) -> str:
    """A completion's prompt as text: as sent, or its token ids decoded (special tokens too)."""
    if isinstance(prompt, str):
        return prompt
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise ValueError(f"echoing token ids needs the model's tokenizer: {type(engine).__name__} has none")
    vocab = getattr(engine, "vocab_size", None)
    bad = next((t for t in prompt if vocab is not None and t >= vocab), None)
    if bad is not None:
        raise ValueError(f"the prompt holds token id {bad}, outside the model's {vocab}-token vocabulary")
    return str(tokenizer.decode(list(prompt)))


def _nothing_generated(prompt_tokens: int, started: float) -> DecodeStats:
    """The stats of a call that only echoed its prompt (``max_tokens: 0``)."""
    seconds = time.perf_counter() - started
    return DecodeStats(
        prompt_tokens=prompt_tokens,
        new_tokens=0,
        steps=0,
        accepted_per_step=(),
        drafted_per_step=(),
        draft_sources=(),
        prefill_seconds=seconds,
        seconds=seconds,
        finish_reason="length",
    )
