"""The one prompt-formatting path: text, token ids, or chat messages to token ids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["RAG_SYSTEM", "Prompt", "encode_prompt", "rag_messages"]

Prompt = str | Sequence[int] | Sequence[Mapping[str, str]] | torch.Tensor

RAG_SYSTEM = (
    "You are a helpful assistant. Answer the question using the context. "
    "Quote the context where it answers the question."
)


def rag_messages(question: str, context: str, system: str | None = RAG_SYSTEM) -> list[dict[str, str]]:
    """Chat messages asking ``question`` about ``context``."""
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": f"Context:\n{context}\n\nQuestion: {question}"})
    return messages


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids for ``prompt``.

    A ``str`` is tokenized as it is (no chat template); a list of ``{"role", "content"}``
    messages goes through the tokenizer's chat template with the generation prompt added;
    token ids (a list or a ``[L]`` / ``[1, L]`` tensor) pass through.
    """
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if prompt.dim() != 1:
            raise ValueError(f"a prompt tensor must be [L] or [1, L], got {tuple(prompt.shape)}")
        ids = prompt.tolist()
    elif isinstance(prompt, str):
        ids = tokenizer(prompt).input_ids
    elif not isinstance(prompt, Sequence):
        raise TypeError(
            f"a prompt is a str, token ids, or a list of chat messages, got {type(prompt).__name__}"
        )
    elif prompt and all(isinstance(m, Mapping) for m in prompt):
        ids = _apply_chat_template(tokenizer, prompt)  # type: ignore[arg-type]
    elif all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        raise TypeError("a prompt is a str, token ids, or a list of chat messages")
    if not ids:
        raise ValueError("the prompt is empty")
    return ids


def _apply_chat_template(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template; pass the prompt as plain text or token ids")
    encoded = tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])
