"""The one prompt-formatting path: text, token ids, or chat messages to token ids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch

from rag_lookahead.config import keyword_arguments
from rag_lookahead.structured.tools import check_tools, detect_tool_format, template_messages

__all__ = [
    "RAG_SYSTEM",
    "Prompt",
    "PromptKind",
    "check_chat_template_kwargs",
    "encode_prompt",
    "rag_messages",
    "read_prompt",
]

# Chat messages are {"role", "content"} mappings; an assistant's may carry `tool_calls` and a
# tool result its `tool_call_id` (see `rag_lookahead.structured.tools.template_messages`).
Prompt = str | Sequence[int] | Sequence[Mapping[str, Any]] | torch.Tensor

PromptKind = Literal["text", "ids", "chat"]

RAG_SYSTEM = (
    "You are a helpful assistant. Answer the question using the context. "
    "Quote the context where it answers the question."
)


def rag_messages(
    question: str,
    context: str,
    system: str | None = RAG_SYSTEM,
    history: Sequence[tuple[str, str]] = (),
) -> list[dict[str, str]]:
    """Chat messages asking ``question`` about ``context``, after the earlier turns of the
    conversation (``(question, answer)`` pairs, oldest first; shown without their context)."""
    messages = [{"role": "system", "content": system}] if system else []
    for asked, answered in history:
        messages += [{"role": "user", "content": asked}, {"role": "assistant", "content": answered}]
    messages.append({"role": "user", "content": f"Context:\n{context}\n\nQuestion: {question}"})
    return messages


def encode_prompt(
    tokenizer: Any,
    prompt: Prompt,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """Token ids for ``prompt``.

    A ``str`` is tokenized as it is (no chat template); a list of ``{"role", "content"}``
    messages goes through the tokenizer's chat template with the generation prompt added and
    ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}`` for Qwen3) as the template's
    variables; token ids (a list or a ``[L]`` / ``[1, L]`` tensor) pass through.

    ``tools`` (OpenAI-style function tools, see `rag_lookahead.structured.tools.check_tools`)
    are rendered by the chat template (``apply_chat_template(..., tools=...)``); they need chat
    messages and a template with tool support (else `ToolsNotSupportedError` naming the model).
    """
    checked_tools = check_tools(tools) if tools is not None else []
    kind, value = read_prompt(prompt)
    if checked_tools and kind != "chat":
        raise TypeError("tools= needs a prompt of chat messages (the chat template renders them)")
    if kind == "text":
        ids = tokenizer(value).input_ids
    elif kind == "chat":
        ids = _apply_chat_template(tokenizer, value, chat_template_kwargs or {}, checked_tools)
    else:
        ids = value
    if not ids:
        raise ValueError("the prompt is empty")
    return ids


def read_prompt(prompt: Prompt) -> tuple[PromptKind, Any]:
    """What ``prompt`` is, read the same way by every engine: ``("text", str)``, ``("ids",
    list[int])`` (a list, or a ``[L]`` / ``[1, L]`` tensor) or ``("chat", list of messages)``;
    a clear error for anything else. An empty prompt is returned as it is."""
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if prompt.dim() != 1:
            raise ValueError(f"a prompt tensor must be [L] or [1, L], got {tuple(prompt.shape)}")
        return "ids", prompt.tolist()
    if isinstance(prompt, str):
        return "text", prompt
    if not isinstance(prompt, Sequence):
        raise TypeError(
            f"a prompt is a str, token ids, or a list of chat messages, got {type(prompt).__name__}"
        )
    items: list[Any] = list(prompt)
    if items and all(isinstance(m, Mapping) for m in items):
        return "chat", items
    if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return "ids", items
    raise TypeError("a prompt is a str, token ids, or a list of chat messages")


# What `encode_prompt` itself decides: a prompt of token ids that ends where the answer begins.
_TEMPLATE_OWN = dict.fromkeys(
    (
        *("conversation", "add_generation_prompt", "continue_final_message", "tokenize"),
        *("return_dict", "return_tensors", "return_assistant_tokens_mask", "padding"),
        *("truncation", "max_length"),
    ),
    "rag-lookahead sets it for every prompt",
) | {"tools": "pass tools to the call (tools=), which checks them and the template's tool format"}


def check_chat_template_kwargs(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``kwargs`` as a plain dict, or a clear error for a wrong type or a key the engine sets."""
    return keyword_arguments("chat_template_kwargs", kwargs, _TEMPLATE_OWN)


def _apply_chat_template(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    template_kwargs: Mapping[str, Any],
    tools: list[dict[str, Any]],
) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template; pass the prompt as plain text or token ids")
    extra: dict[str, Any] = {}
    if tools:
        detect_tool_format(tokenizer, template_kwargs)  # a clear error for a template without tools
        extra["tools"] = tools
    encoded = tokenizer.apply_chat_template(
        template_messages(messages),
        **template_kwargs,
        **extra,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )
    return list(encoded["input_ids"])
