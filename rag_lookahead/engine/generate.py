"""A drop-in for `model.generate`: same common arguments, same returned tensor.

    engine = LookaheadEngine(model, tokenizer)
    output = engine.generate(**inputs, max_new_tokens=128)   # was: model.generate(...)

Rows are decoded together, each as its own call (continuous batching, each row without its
padding); left or right padding in ``input_ids`` is removed using ``attention_mask`` and kept
in the output, and finished rows are padded on the right with ``pad_token_id``, as `generate`
does.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch

from rag_lookahead.config import GenerationParams
from rag_lookahead.streaming.stream import TextStream

__all__ = ["generate"]

# transformers' `max_length` where neither the call nor the model sets one, counted past the
# prompt (its `_prepare_generated_length`), then cut to the model's window.
_DEFAULT_NEW_TOKENS = 20


class LookaheadEngine(Protocol):
    """What the drop-in needs of `rag_lookahead.LookaheadEngine` (which calls it)."""

    @property
    def model(self) -> Any: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    def stream(
        self, prompt: Any, params: GenerationParams | None = None, *, documents: Iterable[str] = ()
    ) -> TextStream: ...


# What `generate` samples with where neither the call nor the model's generation config sets
# ``top_k``: transformers' own default (its global generation defaults).
_TOP_K = 50


def generate(
    engine: LookaheadEngine,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int | None = None,
    max_length: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    stop_strings: str | Sequence[str] | None = None,
    pad_token_id: int | None = None,
    streamer: Any = None,
    documents: Iterable[str] = (),
    seed: int | None = None,
    tokenizer: Any = None,
    **unsupported: Any,
) -> torch.Tensor:
    """``[B, L + T]`` token ids: each row's input, then its new tokens, like `model.generate`.

    Unset arguments come from ``model.generation_config``, as in `generate`, and the lengths
    are read as it reads them (`_max_new_tokens`). ``documents`` are
    texts to draft from in this call; ``tokenizer`` is accepted for signature compatibility.
    """
    del tokenizer  # `generate` needs it for stop strings; the engine has its own
    if unsupported:
        raise TypeError(f"unsupported generate() arguments: {', '.join(sorted(unsupported))}")
    _check_inputs(input_ids, attention_mask)
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError("a streamer needs a batch of one sequence, as in model.generate")
    gc = engine.model.generation_config
    window = getattr(engine.model.config, "max_position_embeddings", None)
    params = GenerationParams(
        max_new_tokens=_max_new_tokens(gc, max_new_tokens, max_length, input_ids.shape[1], window),
        do_sample=bool(gc.do_sample) if do_sample is None else do_sample,
        temperature=_pick(temperature, gc.temperature, 1.0),
        top_k=_pick(top_k, gc.top_k, _TOP_K),
        top_p=_pick(top_p, gc.top_p, 1.0),
        repetition_penalty=_pick(repetition_penalty, gc.repetition_penalty, 1.0),
        eos_token_id=_ids(eos_token_id) if eos_token_id is not None else engine.eos_token_ids,
        stop_strings=_pick(stop_strings, getattr(gc, "stop_strings", None), ()),
        seed=seed,
    )
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    docs = list(documents)
    # Every row is submitted before any is read: the engine decodes them as one batch.
    prompts = [ids[m.bool()] for ids, m in zip(input_ids.cpu(), mask.cpu(), strict=True)]
    streams = [engine.stream(ids, params, documents=docs) for ids in prompts]
    rows = [_read_row(stream, ids, streamer) for stream, ids in zip(streams, prompts, strict=True)]
    pad = pad_token_id if pad_token_id is not None else gc.pad_token_id
    if pad is None:
        pad = params.eos_token_id[0] if params.eos_token_id else 0
    width = max(len(r) for r in rows)
    new = torch.full((len(rows), width), pad, dtype=input_ids.dtype)
    for i, row in enumerate(rows):
        new[i, : len(row)] = torch.tensor(row, dtype=input_ids.dtype)
    return torch.cat([input_ids, new.to(input_ids.device)], dim=1)


def _check_inputs(input_ids: Any, attention_mask: Any) -> None:
    """Refuse what `model.generate` would fail on later, or misread, before any work."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if input_ids.dim() != 2 or 0 in input_ids.shape:
        raise ValueError(f"input_ids must be [batch, length] and non-empty, got {tuple(input_ids.shape)}")
    if attention_mask is None:
        return
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}"
        )
    if not bool(attention_mask.bool().any(dim=1).all()):
        raise ValueError("attention_mask leaves a row with no tokens")


def _read_row(stream: TextStream, ids: torch.Tensor, streamer: Any) -> list[int]:
    if streamer is not None:
        streamer.put(ids.unsqueeze(0))  # `generate` hands the streamer the prompt first
    tokens: list[int] = []
    for chunk in stream.chunks():
        tokens += chunk.token_ids
        if streamer is not None and chunk.token_ids:
            streamer.put(torch.tensor(chunk.token_ids))
    if streamer is not None:
        streamer.end()
    return tokens


def _ids(value: int | Sequence[int]) -> tuple[int, ...]:
    return (value,) if isinstance(value, int) else tuple(value)


def _pick(value: Any, configured: Any, default: Any) -> Any:
    if value is not None:
        return value
    return configured if configured is not None else default


def _max_new_tokens(
    gc: Any, requested: int | None, max_length: int | None, prompt_length: int, window: int | None
) -> int:
    """How many tokens a row may get, as `generate` reads its lengths: ``max_new_tokens`` (the
    call's, then the model's), else ``max_length`` (the call's, then the model's), which counts
    the (padded) prompt; neither set, transformers' default of 20 new tokens within the model's
    window. A prompt already at ``max_length`` is `generate`'s own ValueError."""
    if requested is not None:
        return requested
    if gc.max_new_tokens is not None:
        return int(gc.max_new_tokens)
    limit = max_length if max_length is not None else gc.max_length
    if limit is None:
        limit = _default_max_length(prompt_length, window)
    if prompt_length >= limit:
        raise ValueError(
            f"Input length of input_ids is {prompt_length}, but `max_length` is set to {limit}. "
            "This can lead to unexpected behavior. You should consider increasing `max_length` or, "
            "better yet, setting `max_new_tokens`."
        )
    return int(limit) - prompt_length


def _default_max_length(prompt_length: int, window: int | None) -> int:
    """transformers' ``max_length`` where none is set: 20 tokens past the prompt, within the
    model's window; with `generate`'s own warning, so that a drop-in's caller is told as theirs was."""
    limit = _DEFAULT_NEW_TOKENS + prompt_length
    if window is not None:
        limit = min(limit, window)
    warnings.warn(
        f"Using the model-agnostic default `max_length` (={limit}) to control the generation "
        "length. We recommend setting `max_new_tokens` to control the maximum length of the "
        "generation.",
        UserWarning,
        stacklevel=5,  # the caller of `LookaheadEngine.generate`
    )
    return limit
