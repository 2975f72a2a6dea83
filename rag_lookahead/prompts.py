"""The one prompt-formatting path: text, token ids, or chat messages to token ids."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rag_lookahead.config import keyword_arguments
from rag_lookahead.structured.tools import check_tools, detect_tool_format, template_messages

__all__ = [
    "RAG_SYSTEM",
    "Prompt",
    "PromptKind",
    "SpecialText",
    "check_chat_template_kwargs",
    "check_history",
    "conversation_messages",
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
    conversation (``(question, answer)`` pairs, oldest first; shown without their context),
    or a clear error naming ``history`` (`check_history`)."""
    return conversation_messages(question, context, system, check_history(history))


def conversation_messages(
    question: str, context: str, system: str | None, turns: Sequence[tuple[str, str]]
) -> list[dict[str, str]]:
    """`rag_messages` for ``turns`` that `check_history` returned: a caller that renders many
    cuts of one conversation (the pipeline fitting it to the window) checks it once."""
    messages = [{"role": "system", "content": system}] if system else []
    for asked, answered in turns:
        messages += [{"role": "user", "content": asked}, {"role": "assistant", "content": answered}]
    messages.append({"role": "user", "content": f"Context:\n{context}\n\nQuestion: {question}"})
    return messages


def check_history(history: object) -> list[tuple[str, str]]:
    """``history`` as ``(question, answer)`` pairs of strings, or a clear error naming it."""
    if isinstance(history, (str, bytes, Mapping)) or not isinstance(history, Sequence):
        raise TypeError(
            f"history must be a sequence of (question, answer) pairs of strings, got {type(history).__name__}"
        )
    return [_turn(turn, i) for i, turn in enumerate(history)]


def _turn(turn: object, index: int) -> tuple[str, str]:
    if isinstance(turn, (str, bytes, Mapping)) or not isinstance(turn, Sequence):
        raise TypeError(f"history[{index}] must be a (question, answer) pair of strings, got {turn!r:.80}")
    if len(turn) != 2:
        raise ValueError(f"history[{index}] must be a (question, answer) pair, got {len(turn)} items")
    asked, answered = turn
    if not isinstance(asked, str) or not isinstance(answered, str):
        raise TypeError(f"history[{index}] must be a (question, answer) pair of strings, got {turn!r:.80}")
    return asked, answered


def encode_prompt(
    tokenizer: Any,
    prompt: Prompt,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    special_tokens_in_content: bool = False,
    special_text: SpecialText | None = None,
) -> list[int]:
    """Token ids for ``prompt``.

    A ``str`` is tokenized as it is (no chat template), special-token text included: the caller
    owns the whole text. A list of ``{"role", "content"}`` messages goes through the tokenizer's
    chat template with the generation prompt added and ``chat_template_kwargs`` (e.g.
    ``{"enable_thinking": False}`` for Qwen3) as the template's variables; token ids (a list or a
    ``[L]`` / ``[1, L]`` tensor) pass through.

    The messages' strings (content, tool calls' arguments, tools) are text: special-token text
    written in them (``<|im_start|>`` in a user message or a retrieved passage) is tokenized as
    ordinary text, as transformers' ``split_special_tokens=True`` does, so that only the chat
    template's own markup gives control tokens and no message can forge another turn. Messages
    without such text get the ids the template gives. ``special_tokens_in_content=True`` parses it
    as markup instead (for messages that carry raw template text their caller wrote).
    ``special_text`` is `SpecialText.of(tokenizer)` kept by a caller that encodes many prompts
    (found again at each call without it).

    ``tools`` (OpenAI-style function tools, see `rag_lookahead.structured.tools.check_tools`)
    are rendered by the chat template (``apply_chat_template(..., tools=...)``); they need chat
    messages and a template with tool support (else `ToolsNotSupportedError` naming the model).
    """
    if not isinstance(special_tokens_in_content, bool):
        raise TypeError(f"special_tokens_in_content must be True or False, got {special_tokens_in_content!r}")
    checked_tools = check_tools(tools) if tools is not None else []
    kind, value = read_prompt(prompt)
    if checked_tools and kind != "chat":
        raise TypeError("tools= needs a prompt of chat messages (the chat template renders them)")
    if kind == "text":
        ids = tokenizer(value).input_ids
    elif kind == "chat":
        template_kwargs = chat_template_kwargs or {}
        parsed = None if special_tokens_in_content else special_text or SpecialText.of(tokenizer)
        ids = _apply_chat_template(tokenizer, value, template_kwargs, checked_tools, parsed)
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
    special_text: SpecialText | None,
) -> list[int]:
    """The template's ids for ``messages``; their special-token text as text unless
    ``special_text`` is None."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template; pass the prompt as plain text or token ids")
    kwargs = dict(template_kwargs)
    if tools:
        detect_tool_format(tokenizer, template_kwargs)  # a clear error for a template without tools
        kwargs["tools"] = tools
    templated = template_messages(messages)
    if special_text is not None and special_text.held_by([templated, tools]):
        return _content_as_text(tokenizer, templated, kwargs, special_text)
    encoded = tokenizer.apply_chat_template(
        templated, **kwargs, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


@dataclass(frozen=True)
class SpecialText:
    """A tokenizer's special tokens as text spells them: what keeps a message's text from
    becoming control tokens. Made once per tokenizer (`of`): an engine keeps its own."""

    tokens: Mapping[str, Any]  # each special token's text: its `AddedToken` (lstrip, rstrip)
    find: re.Pattern[str] | None  # any of them in a text (None: the tokenizer has none)
    split: re.Pattern[str] | None  # any of them with the white space its lstrip / rstrip swallow

    @classmethod
    def of(cls, tokenizer: Any) -> SpecialText:
        """``tokenizer``'s special tokens: the added tokens ``split_special_tokens=True``
        tokenizes as text (none for a tokenizer without added tokens)."""
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        tokens = {t.content: t for t in added.values() if getattr(t, "special", False) and t.content}
        if not tokens:
            return cls({}, None, None)
        stripping: dict[tuple[bool, bool], list[str]] = {}
        for content, token in tokens.items():
            sides = (bool(getattr(token, "lstrip", False)), bool(getattr(token, "rstrip", False)))
            stripping.setdefault(sides, []).append(content)
        split = "|".join(
            f"{_SPACE if left else ''}{_trie(words)}{_SPACE if right else ''}"
            for (left, right), words in stripping.items()
        )
        return cls(tokens, re.compile(_trie(tokens)), re.compile(split))

    def held_by(self, value: object) -> bool:
        """Whether a string anywhere in ``value`` (mappings' values, sequences' items) spells one."""
        if self.find is None:
            return False
        if isinstance(value, str):
            return self.find.search(value) is not None
        if isinstance(value, Mapping):
            return any(self.held_by(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return any(self.held_by(v) for v in value)
        return False

    def runs(self, text: str) -> list[tuple[str, str | None]]:
        """``text`` as runs of text and special tokens (``(run, None)`` / ``("", token)``),
        split where the tokenizer splits it: at each special token, with the white space its
        ``lstrip`` / ``rstrip`` swallow."""
        if self.split is None:
            return [(text, None)]
        runs: list[tuple[str, str | None]] = []
        start = 0
        for match in self.split.finditer(text):
            if match.start() > start:
                runs.append((text[start : match.start()], None))
            spelled = match.group()
            runs.append(("", spelled if spelled in self.tokens else spelled.strip()))
            start = match.end()
        if start < len(text):
            runs.append((text[start:], None))
        return runs


_SPACE = r"\s*"


def _trie(words: Iterable[str]) -> str:
    """A pattern for any of ``words``, the longest first, factored as a trie: matching costs
    the length of a word, not the number of words (a tokenizer may have thousands)."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}  # a word ends here

    def pattern(node: dict[str, Any]) -> str:
        branches = [re.escape(char) + pattern(child) for char, child in node.items() if char]
        if not branches:
            return ""
        either = f"(?:{'|'.join(branches)})"
        return f"{either}?" if "" in node else either

    return pattern(root)


def _replaced(value: Any, replace: Callable[[str], str]) -> Any:
    """``value`` with ``replace`` applied to every string in it (mappings' keys stay)."""
    if isinstance(value, str):
        return replace(value)
    if isinstance(value, Mapping):
        return {k: _replaced(v, replace) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_replaced(v, replace) for v in value]
    return value


def _content_as_text(
    tokenizer: Any, messages: list[dict[str, Any]], kwargs: dict[str, Any], special_text: SpecialText
) -> list[int]:
    """The chat template's ids with the special-token text of the messages (and tools) tokenized
    as text.

    Each such text is rendered as a marker (letters and digits, which templates, filters and
    ``tojson`` keep as they are), the rendered prompt is split at the template's own special
    tokens, as the tokenizer splits it, and each run between them is tokenized with its markers
    turned back into their text and ``split_special_tokens=True``: every run without a marker
    gets the ids it has in the whole prompt, and one with a marker the ids of its text.
    (transformers tokenizes a rendered template in one mode, special-token text parsed
    everywhere or nowhere: hence the split, around its ``split_special_tokens``.)
    """
    find = special_text.find
    assert find is not None  # only text that spells a special token gets here
    texts: list[str] = []
    nonce = f"rl{uuid.uuid4().hex}"

    def mark(match: re.Match[str]) -> str:
        texts.append(match.group())
        return f"{nonce}x{len(texts) - 1}x"

    def mask(text: str) -> str:
        return find.sub(mark, text)

    masked = _replaced(messages, mask)
    if "tools" in kwargs:
        kwargs = {**kwargs, "tools": _replaced(kwargs["tools"], mask)}
    rendered = tokenizer.apply_chat_template(masked, **kwargs, add_generation_prompt=True, tokenize=False)
    marker = re.compile(f"{nonce}x(\\d+)x")
    ids: list[int] = []
    for run, special in special_text.runs(str(rendered)):
        if special is not None:
            ids.append(tokenizer.convert_tokens_to_ids(special))
            continue
        text = marker.sub(lambda m: texts[int(m.group(1))], run)
        if nonce in text:  # a template that cut a marker: its text would be lost
            raise ValueError("the chat template altered a message's text; it cannot be tokenized as text")
        ids += tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids
    return ids
