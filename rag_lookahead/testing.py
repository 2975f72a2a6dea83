"""Tiny in-process models and tokenizers for tests: the core's and both integrations' suites.

Random weights give gibberish, but deterministic gibberish, which is all losslessness tests
need: the same tokens with lookahead on and off. Nothing here downloads anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    GemmaConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
)

from rag_lookahead.config import LookaheadConfig, Mode
from rag_lookahead.engine import LookaheadEngine

__all__ = [
    "ASCII_VOCAB",
    "FAMILIES",
    "VOCAB",
    "AsciiTokenizer",
    "CharTokenizer",
    "greedy_reference",
    "save_tiny_model",
    "tiny_config",
    "tiny_engine",
    "tiny_model",
]

VOCAB = 96
ASCII_VOCAB = 95  # token i is chr(32 + i): space to "~"
FAMILIES = ("llama", "qwen2", "mistral", "gemma", "phi3", "gpt2")


def tiny_config(family: str, vocab: int = VOCAB, **extra: Any) -> Any:
    """A two-layer config of ``family`` with a ``vocab``-token vocabulary and no special tokens."""
    common: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": 0,
    }
    common.update(extra)
    if family == "gpt2":
        return GPT2Config(
            vocab_size=vocab,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=512,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=0,
        )
    configs: dict[str, Any] = {
        "llama": LlamaConfig,
        "qwen2": Qwen2Config,
        "mistral": lambda **kw: MistralConfig(**{"sliding_window": None, **kw}),
        "gemma": lambda **kw: GemmaConfig(head_dim=8, **kw),
        "phi3": Phi3Config,
    }
    return configs[family](**common)


@cache
def tiny_model(family: str = "llama", seed: int = 0, vocab: int = VOCAB) -> Any:
    """A random-weight model of ``family`` (cached: treat it as read-only)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, vocab)).eval()
    # Random init gives near-uniform logits; sharpen them so greedy paths repeat like real text.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


class _Encoding:
    def __init__(self, ids: list[int]) -> None:
        self.input_ids = ids


class CharTokenizer:
    """Token i is the single character ``chr(0x4E00 + i)``; no special tokens, no chat template."""

    eos_token_id = None
    chat_template: str | None = None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(0x4E00 + int(i)) for i in ids)

    def encode(self, text: str) -> list[int]:
        return [ord(c) - 0x4E00 for c in text]

    def __call__(self, text: str, add_special_tokens: bool = True) -> _Encoding:
        return _Encoding(self.encode(text))


class AsciiTokenizer(CharTokenizer):
    """One printable ASCII character per token, and a one-line-per-message chat template."""

    chat_template = "role: content | "  # any truthy template; `apply_chat_template` renders it

    def encode(self, text: str) -> list[int]:
        return [min(max(ord(c) - 32, 0), ASCII_VOCAB - 1) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + int(i)) for i in ids)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True, **_: Any
    ) -> dict[str, list[int]]:
        text = "".join(f"{m['role']}: {m['content']} | " for m in messages)
        if add_generation_prompt:
            text += "assistant: "
        return {"input_ids": self.encode(text)}


def tiny_engine(mode: Mode = "trie") -> LookaheadEngine:
    """A fresh engine (its own trie) over the tiny Llama with the ASCII tokenizer."""
    model = tiny_model("llama", 0, ASCII_VOCAB)
    return LookaheadEngine(model, AsciiTokenizer(), LookaheadConfig(mode=mode, min_query_length=1))


def greedy_reference(model: Any, prompt: Sequence[int], max_new_tokens: int, **kwargs: Any) -> list[int]:
    """Plain `model.generate` greedy continuation (new tokens only)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([list(prompt)]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            **kwargs,
        )
    return list(out[0, len(prompt) :].tolist())


# Renders `enable_thinking=False` as Qwen3's template does in spirit: a marker in the prompt.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} | {% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def save_tiny_model(directory: Path, family: str = "llama") -> Path:
    """The tiny model of ``family`` and a one-character-per-token fast tokenizer with a chat
    template, saved as a model directory that ``from_pretrained`` loads (offline)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    # BPE without merges splits text into characters; Fuse joins them back on decoding.
    vocab = {chr(32 + i): i for i in range(ASCII_VOCAB)} | {"<eos>": ASCII_VOCAB}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="?"))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", chat_template=TINY_CHAT_TEMPLATE
    )
    model = tiny_model(family, 0, ASCII_VOCAB + 1)
    model.generation_config.eos_token_id = ASCII_VOCAB
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
