"""A tiny in-process causal LM and a printable-ASCII tokenizer with a chat template.

Outputs of a random model are gibberish but deterministic, which is all the adapters' tests
need: the same text with lookahead on and off, stop strings cut exactly, callbacks per chunk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import torch
from rag_lookahead import LookaheadConfig, LookaheadEngine
from transformers import AutoModelForCausalLM, LlamaConfig

VOCAB = 95  # token i is chr(32 + i): space to "~"


class AsciiTokenizer:
    """One printable ASCII character per token; no special tokens, so no end of sequence."""

    eos_token_id = None
    chat_template = "role: content lines"  # any truthy template; `apply_chat_template` renders

    def encode(self, text: str) -> list[int]:
        return [min(max(ord(c) - 32, 0), VOCAB - 1) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + int(i)) for i in ids)

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        return type("Encoding", (), {"input_ids": self.encode(text)})()

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True, **_: Any
    ) -> dict[str, list[int]]:
        text = "".join(f"{m['role']}: {m['content']} | " for m in messages)
        if add_generation_prompt:
            text += "assistant: "
        return {"input_ids": self.encode(text)}


@cache
def tiny_model(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
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
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # sharper logits, so greedy paths repeat like real text
        for p in model.parameters():
            p.mul_(4.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def tiny_engine(mode: str = "trie") -> LookaheadEngine:
    """A fresh engine (own trie) over the shared tiny model."""
    return LookaheadEngine(tiny_model(), AsciiTokenizer(), LookaheadConfig(mode=mode, min_query_length=1))  # type: ignore[arg-type]
