"""What a library's LLM class (LlamaIndex's, LangChain's) needs of the translation core
besides what a server request needs: a call whose prompt is already in the engine's terms,
a reply's text streamed up to where a tool call may begin, and the model's display name.

A library call's options are the keys of an OpenAI-style request (``max_tokens``,
``temperature``, ``stop``, ``tools``...) and are planned exactly as the server plans a
request (`plan_call`), so every front end accepts the same values with the same errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rag_lookahead.adapters.errors import RequestError
from rag_lookahead.adapters.requests import CallPlan, plan_chat, plan_completion
from rag_lookahead.config import GenerationParams
from rag_lookahead.interface import Engine
from rag_lookahead.models import DEFAULT_MODEL, builtin_name, default_cache_dir
from rag_lookahead.prompts import Prompt
from rag_lookahead.structured import ToolFormat

__all__ = ["ReplyText", "display_name", "plan_call"]

# What only the prompt itself gives: a call's options never carry them.
_PROMPT_KEYS = ("messages", "prompt")


def plan_call(
    prompt: Prompt,
    options: Mapping[str, Any],
    engine: Engine,
    defaults: GenerationParams | None = None,
) -> CallPlan:
    """One call of ``prompt`` (chat messages or a text) with ``options``, an OpenAI-style
    request's keys, planned as the server plans ``/v1/chat/completions`` (messages) or
    ``/v1/completions`` (a text); a bad option is a `RequestError` naming it."""
    given = sorted(key for key in _PROMPT_KEYS if key in options)
    if given:
        raise RequestError(f"the prompt is given apart from the options, not as {given[0]!r}", given[0])
    if isinstance(prompt, str):
        if options.get("tools"):
            raise RequestError(
                "tools need chat messages formatted by the model's chat template, not a text prompt",
                "tools",
                "tools_not_supported",
            )
        return plan_completion({**options, "prompt": prompt}, defaults)
    if not isinstance(prompt, Sequence) or not all(isinstance(m, Mapping) for m in prompt):
        raise RequestError("a call's prompt is chat messages or a text", "messages")
    return plan_chat({**options, "messages": list(prompt)}, engine, defaults)


class ReplyText:
    """A reply's text as it streams: what is surely content is shown as it comes; from where a
    tool call may begin (`ToolFormat.content_end`) the text is held back until the reply ends,
    when its ``rest`` is parsed. Without a tool format every piece is shown at once."""

    def __init__(self, tool_format: ToolFormat | None = None) -> None:
        self.format = tool_format
        self.text = ""
        self.shown = 0

    def add(self, piece: str) -> str:
        """Take the next ``piece`` of the reply; the content it newly shows (``""`` if none)."""
        self.text += piece
        end = len(self.text) if self.format is None else self.format.content_end(self.text)
        if end <= self.shown:
            return ""
        delta, self.shown = self.text[self.shown : end], end
        return delta

    @property
    def rest(self) -> str:
        """The text held back so far (what a tool call may be)."""
        return self.text[self.shown :]


def display_name(engine: Engine) -> str:
    """The model's name for traces and metadata: a built-in model converted into the cache is
    named by its built-in name, any other model by its name or path."""
    name = engine.model_name
    if not name:
        return DEFAULT_MODEL
    if Path(name).parent == default_cache_dir() / "models":
        return builtin_name(name) or name
    return name
