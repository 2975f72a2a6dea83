"""Attention for trees and batches on CPU, registered with transformers under its own name.

A draft tree or a batch of rows needs an explicit mask. Given one, transformers' SDPA path
copies every key/value head once per query head it serves (``repeat_kv``), because on CUDA a
masked grouped-query call falls back to a slow kernel. On CPU torch computes masked
grouped-query attention directly (``enable_gqa``), with the same result, so the copy — which
costs more than the attention itself for a batch of long RAG contexts — is not needed there.

`grouped_sdpa_attention` does exactly that and hands every other case (no mask, a single
query, another device, softcapping, position biases) to transformers' own SDPA function. It is
registered under its own name with transformers' attention interface, and the engine's forwards
of a CPU model that attends with ``"sdpa"`` select it for their duration (`grouped_attention`);
the model's code is untouched, and outside those forwards it attends as configured (so that,
e.g., transformers' own continuous batching, which accepts only its known implementations,
still runs on it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = ["ATTENTION_NAME", "attention_used", "grouped_attention", "grouped_sdpa_attention", "register"]

ATTENTION_NAME = "rag_lookahead_sdpa"


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, KV, L, D]
    value: torch.Tensor,  # [B, KV, L, D]
    attention_mask: torch.Tensor | None,  # [B, 1, T, L]
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, without copying key/value heads under a mask on CPU."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
    if attention_mask is None or not grouped or plain or query.shape[2] == 1 or query.device.type != "cpu":
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # [B, H, T, D]
    return out.transpose(1, 2).contiguous(), None  # [B, T, H, D], as transformers expects


@cache
def register() -> str:
    """Make `grouped_sdpa_attention` (with SDPA's masks) selectable by name; returns the name."""
    AttentionInterface.register(ATTENTION_NAME, grouped_sdpa_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME


def attention_used(model: Any, device: torch.device) -> str | None:
    """The attention the engine's forwards of ``model`` on ``device`` run with."""
    configured = getattr(model.config, "_attn_implementation", None)
    return ATTENTION_NAME if configured == "sdpa" and device.type == "cpu" else configured


@contextmanager
def grouped_attention(model: Any, device: torch.device) -> Iterator[None]:
    """Within this block ``model`` attends with `grouped_sdpa_attention` where it applies."""
    if attention_used(model, device) != ATTENTION_NAME:
        yield
        return
    model.config._attn_implementation = register()
    try:
        yield
    finally:
        model.config._attn_implementation = "sdpa"
