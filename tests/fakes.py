"""Tiny in-process models of several families, and a one-character-per-token tokenizer."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

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

VOCAB = 96
FAMILIES = ("llama", "qwen2", "mistral", "gemma", "phi3", "gpt2")


def tiny_config(family: str, vocab: int = VOCAB, **extra: Any) -> Any:
    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    common.update(extra)
    if family == "gpt2":
        return GPT2Config(
            vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=512,
            bos_token_id=None, eos_token_id=None, pad_token_id=0,
        )
    configs = {
        "llama": LlamaConfig,
        "qwen2": Qwen2Config,
        "mistral": lambda **kw: MistralConfig(**{"sliding_window": None, **kw}),
        "gemma": lambda **kw: GemmaConfig(head_dim=8, **kw),
        "phi3": Phi3Config,
    }
    return configs[family](**common)


@lru_cache(maxsize=None)
def tiny_model(family: str, seed: int = 0, vocab: int = VOCAB) -> Any:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, vocab)).eval()
    # Random init gives near-uniform logits; sharpen them so greedy paths repeat like real text.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


class CharTokenizer:
    """Token i is the single character ``chr(0x4E00 + i)``; no special tokens."""

    eos_token_id = None
    chat_template = None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(0x4E00 + int(i)) for i in ids)

    def encode(self, text: str) -> list[int]:
        return [ord(c) - 0x4E00 for c in text]

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        return type("Encoding", (), {"input_ids": self.encode(text)})()


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
    return out[0, len(prompt):].tolist()
