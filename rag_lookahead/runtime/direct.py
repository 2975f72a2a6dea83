"""The model's forward run directly, without its modules' calls, for Llama-shaped families.

transformers' forward of a small model spends a large share of a decoding step in Python
around its operators: every module's ``__call__`` (hook dispatch), the decorators on each
layer and attention (keyword checks, output capture), the keyword plumbing between them. For
one token the operators themselves are short, so those costs weigh (`benchmarks/README.md`,
*The direct forward*). vLLM avoids them by owning its models' code; this module does the same
for the families whose decoder layers are Llama's — an RMS norm, attention over rotated
queries and keys, a gated MLP, residual adds — and nothing else: it runs the same operators on
the model's own weights, in the same order, calling the model's own pieces wherever the
family might differ (the rotary embedding, the mask function, the attention function, the
cache's ``update``, the norms), each linear layer multiplied by the engine's kernel for the
forward (`rag_lookahead.runtime.kernels.LinearKernels.function`), which then needs no layer's
``forward`` shadowed.

`DirectForward.of` accepts a model only where its structure is exactly that (its classes,
every layer attending to its whole context, no hook on any module); the tuning wing then
compares it with the model's own forward on probe inputs, bit for bit, before the runner uses
it (`rag_lookahead.tuning.probes.direct_matches`), and each of the runner's forwards checks
(`DirectForward.applies`) that no hook, replaced module or training mode came since. Anything
else runs the model as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rag_lookahead.runtime.attention import attention_used, register
from rag_lookahead.runtime.kernels import torch_linear

__all__ = ["DirectForward", "DirectOutput"]

# A linear layer's output for its input (`rag_lookahead.runtime.kernels.LinearKernels.function`).
Linear = Callable[[torch.nn.Linear, torch.Tensor], torch.Tensor]

# Families whose decoder layer is Llama's, by model class name: (causal LM, decoder layer, norm).
_FAMILIES = {
    "LlamaForCausalLM": ("LlamaDecoderLayer", "LlamaRMSNorm"),
    "MistralForCausalLM": ("MistralDecoderLayer", "MistralRMSNorm"),
    "Qwen2ForCausalLM": ("Qwen2DecoderLayer", "Qwen2RMSNorm"),
}


@dataclass(frozen=True)
class DirectOutput:
    """What the engine reads of a forward: the logits ``[B, T, V]`` and the cache."""

    logits: torch.Tensor
    cache: Any


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's pieces, read once."""

    index: int
    attention: torch.nn.Module
    input_norm: torch.nn.Module
    q: torch.nn.Linear
    k: torch.nn.Linear
    v: torch.nn.Linear
    o: torch.nn.Linear
    post_norm: torch.nn.Module
    gate: torch.nn.Linear
    up: torch.nn.Linear
    down: torch.nn.Linear
    act: Callable[[torch.Tensor], torch.Tensor]


class DirectForward:
    """``model``'s forward as its own modules compute it, without their calls (see the module's
    docstring); made by `of`, which returns ``None`` for a model of another shape."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = inner.norm
        self.head = model.lm_head
        layers = inner.layers[: self.config.num_hidden_layers]  # (as the model's own loop reads them)
        self.layers = tuple(_layer(i, layer) for i, layer in enumerate(layers))
        modules = tuple(model.modules())
        # Registering a hook, or a submodule, changes its module's own dicts: these are read live.
        self._hooks = tuple(hooks for m in modules for hooks in (m._forward_hooks, m._forward_pre_hooks))
        self._attributes = tuple(m.__dict__ for m in modules)
        self._tree = tuple(
            (m._modules, name, child, type(child)) for m in modules for name, child in m._modules.items()
        )
        # The attention the engine's forwards run with, looked up once by its name (the model's
        # own layers look it up in their config at each call); ``"eager"`` is no registered
        # interface: it is the family's own function.
        eager = sys.modules[type(inner.layers[0].self_attn).__module__].eager_attention_forward
        self._configured = self.config._attn_implementation
        register()
        name = attention_used(model, next(model.parameters()).device)
        self.attend = eager if name in (None, "eager") else ALL_ATTENTION_FUNCTIONS.get_interface(name, eager)

    @classmethod
    def of(cls, model: Any) -> DirectForward | None:
        """A direct forward of ``model``, or ``None`` where its structure is not one this runs."""
        names = _FAMILIES.get(type(model).__name__)
        inner = getattr(model, "model", None)
        if names is None or inner is None or not _plain_layers(model, inner, names):
            return None
        forward = cls(model)
        return forward if forward.applies() else None

    def applies(self) -> bool:
        """Whether the model is still as this forward read it: in eval mode, the attention its
        config names, no hook on any of its modules (nor a global one), no module's ``forward``
        replaced on the instance, no module replaced by another (an adapter's layer) or changed
        in class."""
        return not (
            self.model.training
            or self.config._attn_implementation != self._configured
            or _global_hooks()
            or any(self._hooks)
            or any("forward" in attributes for attributes in self._attributes)
            or not all(
                modules.get(name) is child and type(child) is kind
                for modules, name, child, kind in self._tree
            )
        )

    def __call__(
        self,
        input_ids: torch.Tensor,  # [B, T]
        cache: Any = None,
        position_ids: torch.Tensor | None = None,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, 1, T, L]
        logits_to_keep: int | torch.Tensor = 0,
        use_cache: bool = True,
        linear: Linear = torch_linear,
        **kwargs: Any,
    ) -> DirectOutput:
        """The logits (``[B, T, V]``, or at ``logits_to_keep``'s positions) and the cache, as
        ``model(input_ids=..., cache=..., position_ids=..., attention_mask=..., use_cache=...,
        logits_to_keep=..., **kwargs)`` gives them: ``kwargs`` are handed to the attention, as
        the model's forward hands its extra keywords on."""
        hidden = torch.nn.functional.embedding(
            input_ids, self.embed.weight, self.embed.padding_idx
        )  # [B, T, H]
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(hidden.shape[1], device=hidden.device) + past).unsqueeze(0)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden,
            attention_mask=attention_mask,
            cache=cache,
            position_ids=position_ids,
        )
        cos, sin = self.rotary(hidden, position_ids=position_ids)  # each [B, T, D]
        rotation = (cos.unsqueeze(1), sin.unsqueeze(1))  # each [B, 1, T, D]
        for layer in self.layers:
            hidden = _decoder_layer(
                layer, hidden, rotation, mask, cache, position_ids, self.attend, use_cache, linear, kwargs
            )
        hidden = self.norm.forward(hidden)
        # (the runner keeps the last positions, or the same positions of every row)
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        return DirectOutput(linear(self.head, hidden[:, kept, :]), cache)


def _decoder_layer(
    layer: _Layer,
    hidden: torch.Tensor,  # [B, T, H]
    rotation: tuple[torch.Tensor, torch.Tensor],
    mask: Any,
    cache: Any,
    position_ids: torch.Tensor,
    attend: Any,
    use_cache: bool,
    linear: Linear,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """One Llama decoder layer: `LlamaDecoderLayer.forward`'s operators in its order."""
    residual = hidden
    hidden = layer.input_norm.forward(hidden)
    shape = hidden.shape[:-1]
    heads = (*shape, -1, layer.attention.head_dim)
    query = linear(layer.q, hidden).view(heads).transpose(1, 2)  # [B, H, T, D]
    key = linear(layer.k, hidden).view(heads).transpose(1, 2)  # [B, KV, T, D]
    value = linear(layer.v, hidden).view(heads).transpose(1, 2)  # [B, KV, T, D]
    cos, sin = rotation
    query = (query * cos) + (_rotate_half(query) * sin)
    key = (key * cos) + (_rotate_half(key) * sin)
    if cache is not None:
        key, value = cache.update(key, value, layer.index)
    out, _ = attend(
        layer.attention,
        query,
        key,
        value,
        mask,
        dropout=0.0,
        scaling=layer.attention.scaling,
        position_ids=position_ids,
        use_cache=use_cache,
        **kwargs,
    )  # [B, T, H, D]
    out = linear(layer.o, out.reshape(*shape, -1).contiguous())
    hidden = residual + out
    residual = hidden
    hidden = layer.post_norm.forward(hidden)
    hidden = linear(layer.down, layer.act(linear(layer.gate, hidden)) * linear(layer.up, hidden))
    return residual + hidden


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _layer(index: int, layer: Any) -> _Layer:
    attention, mlp = layer.self_attn, layer.mlp
    act = mlp.act_fn
    act_forward = torch.nn.functional.silu if type(act).__name__ == "SiLUActivation" else act.forward
    return _Layer(
        index,
        attention,
        layer.input_layernorm,
        attention.q_proj,
        attention.k_proj,
        attention.v_proj,
        attention.o_proj,
        layer.post_attention_layernorm,
        mlp.gate_proj,
        mlp.up_proj,
        mlp.down_proj,
        act_forward,
    )


def _plain_layers(model: Any, inner: Any, names: tuple[str, str]) -> bool:
    """Whether ``model``'s layers are exactly its family's Llama-shaped ones, every one attending
    to its whole context, with linear layers of torch's own class."""
    layer_name, norm_name = names
    config = model.config
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return False
    if getattr(config, "pretraining_tp", 1) != 1:
        return False
    norms = [
        inner.norm,
        *(n for layer in inner.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)),
    ]
    if any(type(layer).__name__ != layer_name for layer in inner.layers) or not inner.layers:
        return False
    if any(type(norm).__name__ != norm_name for norm in norms):
        return False
    linears = [model.lm_head]
    for layer in inner.layers:
        attention, mlp = layer.self_attn, layer.mlp
        linears += [attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj]
        linears += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    embed = inner.embed_tokens
    embedding = type(embed) is torch.nn.Embedding and embed.max_norm is None  # (max_norm writes weights)
    return embedding and all(type(linear) is torch.nn.Linear for linear in linears)


def _global_hooks() -> bool:
    from torch.nn.modules import module

    return bool(module._global_forward_hooks or module._global_forward_pre_hooks)
