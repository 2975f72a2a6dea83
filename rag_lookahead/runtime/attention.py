"""Attention for trees and batches on CPU, registered with transformers under its own name.

A draft tree or a batch of rows needs an explicit mask. Given one, transformers' SDPA path
copies every key/value head once per query head it serves (``repeat_kv``), because on CUDA a
masked grouped-query call falls back to a slow kernel. On CPU torch computes masked
grouped-query attention directly (``enable_gqa``), with the same result, so the copy — which
costs more than the attention itself for a batch of long RAG contexts — is not needed there.

`grouped_sdpa_attention` does exactly that and hands every other case (no mask, a single
query, another device, softcapping, position biases) to transformers' own SDPA function. It is
registered under its own name with transformers' attention interface: the engine's direct
forward calls it by that name, and its forwards of the model's own code select it for their
duration (`rag_lookahead.runtime.runner`); the model's code is untouched, and outside those
forwards it attends as configured (so that, e.g., transformers' own continuous batching, which
accepts only its known implementations, still runs on it).

How a forward's rows lie is an argument of that forward: a `RowLayout` (`RaggedRows`,
`CausalChunk`, `PackedRows`) the runner passes as the keyword `LAYOUT`, which transformers
hands on, with a forward's other extra keywords, to its attention function. Without one, the
attention is transformers' SDPA but for the grouped heads.

A batch's rows are padded to its longest row's cache, and a row's attention would read every
padded column. In a forward of `RaggedRows` (the engine's batched forwards on CPU) a row whose cache is
much shorter than the longest is attended over its own columns only, one row at a time, when
that reads far fewer columns than the padded batch: the same result (the padded columns are
hidden, so they weigh exactly nothing), up to the rounding of a smaller kernel.

In a forward of a `CausalChunk` (a prompt, or of its chunk after cached entries: the prefix
cache's, or the prompt's earlier chunks) every query sees the columns up to its own, aligned to
the last one. After cached entries the model hands over that mask, and a masked kernel computes
every score, the hidden half too; where the chunk is at least as long as what was cached before
it, the causal kernel does it instead (which skips the hidden half): the chunk's queries after
as many zero queries as cached columns, whose rows are dropped. Where the chunk's linear layers
run on oneDNN (the faster matrix products on this machine: `rag_lookahead.runtime.kernels`), a
long chunk attends block by block of queries instead (`_causal_blocks`): each block's scores
over the columns it sees as one oneDNN product per key/value head, the diagonal block masked, a
softmax, and a product with the values. torch's CPU attention kernels multiply through its BLAS,
which on some CPUs (an AMD EPYC's, with MKL) runs at half oneDNN's rate. Each query's row is
the same dot products and softmax in every way, up to the kernels' rounding.

In a forward of `PackedRows` the batch's drafts come unpadded, one after another in a single sequence
(`rag_lookahead.decoding.tree.PackedInputs`): the linear layers then cost the rows' real tokens
only, and each row's queries attend over that row's keys alone (each row's own buffers, as
`rag_lookahead.runtime.packed_cache.PackedRowCache` hands them over), under its own mask (its
windowed one in a layer that transformers calls with a ``sliding_window``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rag_lookahead.decoding.tree import PackedInputs
from rag_lookahead.runtime.kernels import onednn_linear
from rag_lookahead.runtime.packed_cache import RowStates

__all__ = [
    "ATTENTION_NAME",
    "LAYOUT",
    "CausalChunk",
    "PackedRows",
    "RaggedRows",
    "RowLayout",
    "attention_used",
    "grouped_sdpa_attention",
    "register",
]

ATTENTION_NAME = "rag_lookahead_sdpa"

# The keyword a forward's `RowLayout` travels by, from the runner to the attention.
LAYOUT = "rag_lookahead_rows"
# A chunk attends block by block (`_causal_blocks`) from this many queries and key columns on:
# below, a block's products are too small to beat the fused kernel.
_BLOCKS_FROM = (64, 1024)
_BLOCK = 128  # queries a block: its scores stay in the cores' caches
# Rows are attended one by one only when the padded batch reads at least this many times the
# columns they use: a call per row costs more than one call for the batch.
_SPLIT_WASTE = 1.5


@dataclass(frozen=True)
class RaggedRows:
    """A batched forward's rows on CPU: how many key columns each one uses (its cache and its
    new tokens). A masked attention of these rows attends row ``i`` over its first
    ``spans[i]`` key columns only (every column past them is hidden to it)."""

    spans: tuple[int, ...]

    @classmethod
    def of(cls, spans: Sequence[int]) -> RaggedRows | None:
        """The layout of rows of ``spans`` columns, or ``None`` where the padded batch reads
        fewer than ``_SPLIT_WASTE`` times the columns the rows use (a call per row would cost
        more than one for the batch)."""
        worth = len(spans) > 1 and len(spans) * max(spans) >= _SPLIT_WASTE * sum(spans)
        return cls(tuple(spans)) if worth else None


@dataclass(frozen=True)
class CausalChunk:
    """A forward of a prompt, or of its chunk after the cached entries, under the model's
    causal mask: an attention over a whole context (no sliding window) may compute it with the
    causal kernel, or block by block on oneDNN where ``onednn`` (see the module's docstring)."""

    onednn: bool = False


@dataclass(frozen=True)
class PackedRows:
    """The one packed sequence of a batch's drafts (`PackedInputs`): per row, its queries'
    first index and count in the sequence and its masks in full and in sliding-window layers
    (``None``: it sees all). Each row's queries attend over that row's keys (`RowStates`) alone,
    under its own mask."""

    rows: tuple[tuple[int, int, torch.Tensor | None, torch.Tensor | None], ...]

    @classmethod
    def of(cls, inputs: PackedInputs) -> PackedRows:
        return cls(tuple(zip(inputs.offsets, inputs.sizes, inputs.masks, inputs.sliding, strict=True)))


# How a forward's rows lie, handed to `grouped_sdpa_attention` as the keyword `LAYOUT` of the
# model's forward (transformers passes a forward's extra keywords through to the attention).
RowLayout = RaggedRows | CausalChunk | PackedRows


def _packed(
    query: torch.Tensor,  # [1, H, N, D]
    keys: RowStates,  # per row [1, KV, L_i, D]
    values: RowStates,
    scaling: float | None,
    rows: PackedRows,
    sliding: bool,
) -> torch.Tensor:
    """Each row's queries over its own keys: ``[1, N, H, D]``."""
    outs = [
        torch.nn.functional.scaled_dot_product_attention(
            query[:, :, offset : offset + size],
            key,
            value,
            attn_mask=windowed if sliding else mask,
            scale=scaling,
            enable_gqa=True,
        )  # [1, H, size, D]
        for (offset, size, mask, windowed), key, value in zip(rows.rows, keys, values, strict=True)
    ]
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


def _causal_columns(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, H, T, D]
    key: torch.Tensor,  # [1, KV, L, D]
    mask: torch.Tensor | None,
    plain: bool,
    kwargs: dict[str, Any],
) -> int | None:
    """The columns cached before this call's chunk, where it is a prompt's chunk under the
    causal mask aligned to the last column (a `CausalChunk`); else ``None``: another forward,
    a sliding-window layer, or a mask that is not that one (a padding mask, a window, another
    alignment)."""
    chunk, columns = query.shape[2], key.shape[2]
    cached = columns - chunk
    if (
        plain
        or kwargs.get("sliding_window") is not None
        or query.device.type != "cpu"
        or query.shape[0] != 1
        or chunk < 2
        or cached < 0
    ):
        return None
    if mask is None:  # the whole prompt, causal: how transformers hands it to SDPA
        return 0 if cached == 0 and getattr(module, "is_causal", True) else None
    if mask.shape[-2:] != (chunk, columns):
        return None
    # Its first and last queries' rows: all a padding mask, a window or another alignment
    # would change (the rows between follow the same rule).
    rows = mask[0, 0, (0, -1)]  # [2, L]
    visible = rows if rows.dtype == torch.bool else rows == 0
    first = torch.arange(columns, device=mask.device) <= cached
    return cached if bool(visible[1].all()) and torch.equal(visible[0], first) else None


def _causal_chunk(
    query: torch.Tensor,  # [1, H, T, D]
    key: torch.Tensor,  # [1, KV, L, D]
    value: torch.Tensor,  # [1, KV, L, D]
    masked: bool,
    scaling: float | None,
    cached: int,
    layout: CausalChunk,
) -> torch.Tensor | None:
    """A prompt's chunk after ``cached`` columns, ``[1, T, H, D]``, by the cheapest way that
    applies: block by block on oneDNN, or the causal kernel after zero queries where the chunk
    is masked and at least as long as the cached columns; ``None``: as the model hands it."""
    chunk, columns = query.shape[2], key.shape[2]
    if layout.onednn and chunk >= _BLOCKS_FROM[0] and columns >= _BLOCKS_FROM[1]:
        return _causal_blocks(query, key, value, scaling, cached)
    if not masked or cached > chunk:  # (unmasked, the causal kernel runs already)
        return None
    zeros = query.new_zeros((*query.shape[:2], cached, query.shape[3]))  # [1, H, P, D]
    out = torch.nn.functional.scaled_dot_product_attention(
        torch.cat((zeros, query), dim=2),
        key,
        value,
        is_causal=True,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )[:, :, cached:]  # [1, H, T, D]
    return out.transpose(1, 2).contiguous()


def _causal_blocks(
    query: torch.Tensor,  # [1, H, T, D]
    key: torch.Tensor,  # [1, KV, L, D]
    value: torch.Tensor,  # [1, KV, L, D]
    scaling: float | None,
    cached: int,
) -> torch.Tensor:
    """A prompt's chunk after ``cached`` columns attended block by block of queries, each
    product on oneDNN: ``[1, T, H, D]``."""
    _, heads, chunk, dim = query.shape
    groups = heads // key.shape[1]
    scaled = query[0] * (scaling if scaling is not None else dim**-0.5)  # [H, T, D]
    out = query.new_empty((1, chunk, heads, dim))  # [1, T, H, D]
    hidden = torch.ones(_BLOCK, _BLOCK, dtype=torch.bool, device=query.device).triu(1)
    for kv in range(key.shape[1]):
        heads_of = slice(kv * groups, (kv + 1) * groups)
        keys = key[0, kv].contiguous()  # [L, D] (a view of the cache's rows: no copy)
        values = value[0, kv].transpose(0, 1).contiguous()  # [D, L]
        for start in range(0, chunk, _BLOCK):
            size = min(_BLOCK, chunk - start)
            seen = cached + start + size  # the block's last query sees this many columns
            block = scaled[heads_of, start : start + size].reshape(groups * size, dim)  # [G*n, D]
            scores = onednn_linear(block, keys[:seen]).view(groups, size, seen)  # [G, n, C]
            scores[:, :, seen - size :].masked_fill_(hidden[:size, :size], float("-inf"))
            weights = torch.softmax(scores, dim=-1).view(groups * size, seen)  # [G*n, C]
            # (oneDNN reads a weight's columns only contiguous: a strided one is far slower)
            read = values if seen == values.shape[1] else values[:, :seen].contiguous()  # [D, C]
            out[0, start : start + size, heads_of] = (
                onednn_linear(weights, read).view(groups, size, dim).transpose(0, 1)
            )
    return out


def _split_rows(query: torch.Tensor, key: torch.Tensor, plain: bool, rows: RaggedRows) -> bool:
    """Whether this call should attend row by row over ``rows``' spans."""
    if plain or query.device.type != "cpu" or len(rows.spans) != query.shape[0]:
        return False
    return max(rows.spans) == key.shape[2]  # (a call of other keys: as is)


def _packed_attention(
    query: torch.Tensor,  # [1, H, N, D]
    keys: Any,
    values: Any,
    scaling: float | None,
    layout: RowLayout | None,
    plain: bool,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """A packed forward's attention (`PackedRows` over `RowStates`): ``[1, N, H, D]``."""
    if (
        not isinstance(layout, PackedRows)
        or plain
        or query.shape[0] != 1
        or not isinstance(keys, RowStates)
        or not isinstance(values, RowStates)
        or len(keys) != len(layout.rows)
    ):  # (the probe finds this: e.g. a model that does not hand its forward's keywords on)
        raise RuntimeError("this attention cannot be computed on packed rows")
    sliding = kwargs.get("sliding_window") is not None  # (how transformers' layers say it)
    return _packed(query, keys, values, scaling, layout, sliding)


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
    """transformers' SDPA attention, without copying key/value heads under a mask on CPU, and
    with the rows laid out as the forward's `RowLayout` (keyword `LAYOUT`) says."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
    layout = kwargs.pop(LAYOUT, None)
    if isinstance(layout, PackedRows) or isinstance(key, RowStates):
        return _packed_attention(query, key, value, scaling, layout, plain, kwargs), None
    if (
        isinstance(layout, CausalChunk)
        and dropout == 0.0
        and is_causal is not False
        and (cached := _causal_columns(module, query, key, attention_mask, plain, kwargs)) is not None
        and (out := _causal_chunk(query, key, value, attention_mask is not None, scaling, cached, layout))
        is not None
    ):
        return out, None
    if (
        isinstance(layout, RaggedRows)
        and attention_mask is not None
        and _split_rows(query, key, plain, layout)
    ):
        rows = [
            grouped_sdpa_attention(
                module,
                query[i : i + 1],
                key[i : i + 1, :, :span],
                value[i : i + 1, :, :span],
                attention_mask[i : i + 1, ..., :span],
                dropout,
                scaling,
                is_causal,
                **kwargs,
            )[0]
            for i, span in enumerate(layout.spans)
        ]  # each [1, T, H, D]
        return torch.cat(rows), None  # [B, T, H, D]
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
