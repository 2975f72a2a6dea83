"""A LlamaIndex call's keyword arguments as one OpenAI-style request, planned by the core.

The LLM's own settings and then the call's keyword arguments become the keys of one request
(``max_tokens``, ``temperature``, ``stop``, ``tools``...), which `rag_lookahead.protocol`
plans exactly as the HTTP server plans a request: the same accepted values, the same errors,
temperature 0 as greedy decoding. On top, what LlamaIndex callers pass that no request
carries: the `GenerationParams` names (``max_new_tokens``, ``stop_strings``, ``do_sample``,
``eos_token_id``, ``grammar``), ``scope``, and ``tool_required`` /
``allow_parallel_tool_calls``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llama_index.llms.rag_lookahead.tools import ToolPlan, openai_tools
from rag_lookahead import GenerationParams
from rag_lookahead.config import is_greedy
from rag_lookahead.interface import Engine, Scope
from rag_lookahead.prompts import Prompt
from rag_lookahead.protocol import CallPlan, RequestError, plan_call

__all__ = ["CALL_OPTIONS", "TOOL_OPTIONS", "Call", "Settings", "plan"]

_REQUEST_KEYS = frozenset(
    {"max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty", "documents", "prediction"}
)
# `GenerationParams` fields no OpenAI request carries: set on the plan's params.
_ENGINE_FIELDS = frozenset({"do_sample", "eos_token_id", "grammar"})
_GENERATION_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerationParams))
CALL_OPTIONS = _REQUEST_KEYS | _GENERATION_FIELDS | {"stop", "scope"}
# What a chat call takes for tools; `chat_with_tools` passes them.
TOOL_OPTIONS = frozenset({"tools", "tool_choice", "tool_required", "allow_parallel_tool_calls"})


@dataclass(frozen=True)
class Settings:
    """What a `LookaheadLLM` sets for every call (a call's own keyword arguments replace it)."""

    max_new_tokens: int
    temperature: float
    stop: tuple[str, ...]
    generate_kwargs: Mapping[str, Any]
    prediction: str | None = None


@dataclass(frozen=True)
class Call:
    """One planned call: the core's plan (its tool plan is LlamaIndex's `ToolPlan`), and the
    scope the caller gave, if any."""

    plan: CallPlan
    tools: ToolPlan
    scope: Scope | None = None


def plan(
    prompt: Prompt,
    kwargs: Mapping[str, Any],
    engine: Engine,
    settings: Settings,
    *,
    chat: bool,
    response_format: Mapping[str, Any] | None = None,
) -> Call:
    """The call of ``prompt`` with these keyword arguments (tool options only where ``chat``),
    or a `TypeError` for one it does not take and a `ValueError` for a bad value."""
    accepted = CALL_OPTIONS | TOOL_OPTIONS if chat else CALL_OPTIONS
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {unknown}; accepted: {', '.join(sorted(accepted))}")
    options = {k: v for k, v in kwargs.items() if k not in TOOL_OPTIONS and k != "scope"}
    defaults, default_fields = _defaults(settings)
    request, fields = _split(options)
    request = {**defaults, **request}
    single = False
    if any(key in kwargs for key in TOOL_OPTIONS):
        request.update(_tool_request(kwargs))
        single = not kwargs.get("allow_parallel_tool_calls", True)
    if response_format is not None:
        request["response_format"] = response_format
    core = plan_call("completion" if isinstance(prompt, str) else "chat", prompt, request, engine)
    tools = ToolPlan(core.tools.tools, core.tools.choice, core.tools.format, single=single)
    params = _with_fields(core.params, {**default_fields, **fields}, request.get("temperature"))
    return Call(dataclasses.replace(core, params=params, tools=tools), tools, kwargs.get("scope"))


def _defaults(settings: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    """The LLM's settings as request keys and engine fields: ``generate_kwargs`` over its
    ``temperature``, its ``stop`` after any ``stop_strings`` there, its ``max_new_tokens``."""
    unknown = sorted(set(settings.generate_kwargs) - _GENERATION_FIELDS)
    if unknown:
        raise TypeError(f"generate_kwargs take GenerationParams fields, not {unknown}")
    generate = {k: v for k, v in settings.generate_kwargs.items() if k != "stop_strings"}
    request, fields = _split(generate)
    stops = [*_as_list(settings.generate_kwargs.get("stop_strings")), *settings.stop]
    request = {"temperature": settings.temperature, **request, "prediction": _prediction(settings.prediction)}
    return {**request, "max_tokens": settings.max_new_tokens, "stop": stops}, fields


def _split(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments as request keys, and the engine fields no request carries."""
    request: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    for key, value in options.items():
        if key in _ENGINE_FIELDS:
            fields[key] = value
        elif key == "prediction":
            request[key] = _prediction(value)
        elif key not in ("stop", "stop_strings", "max_tokens", "max_new_tokens"):
            request[key] = list(value) if key == "documents" and isinstance(value, tuple) else value
    given = [options[k] for k in ("stop", "stop_strings") if options.get(k) is not None]
    if given:
        # One of them as given (the core checks it); both, as one list.
        request["stop"] = given[0] if len(given) == 1 else [*_as_list(given[0]), *_as_list(given[1])]
    sizes = {options[k] for k in ("max_new_tokens", "max_tokens") if options.get(k) is not None}
    if len(sizes) > 1:
        raise RequestError("max_new_tokens and max_tokens disagree: give one of them", "max_tokens")
    if sizes:
        request["max_tokens"] = sizes.pop()
    return request, fields


def _tool_request(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The tools as a request's ``tools`` and ``tool_choice``; ``tool_required=True`` makes no
    choice (or ``"auto"``) ``"required"``."""
    choice = kwargs.get("tool_choice")
    if kwargs.get("tool_required"):
        if choice == "none":
            raise ValueError("tool_required=True forces a tool call; tool_choice='none' forbids one")
        if choice in (None, "auto"):
            choice = "required"
    return {"tools": openai_tools(kwargs.get("tools") or []), "tool_choice": choice}


def _with_fields(params: GenerationParams, fields: Mapping[str, Any], temperature: Any) -> GenerationParams:
    """``params`` with the engine fields a caller set: ``do_sample`` (sampling needs a
    temperature above 0), ``eos_token_id`` and a ``grammar`` where the plan sets none."""
    given = {k: v for k, v in fields.items() if v is not None}
    if "grammar" in given and params.grammar is not None:
        raise TypeError("this call sets its own grammar (a forced tool call); pass one or the other")
    if given.get("do_sample") is True and temperature is not None and is_greedy(temperature):
        raise ValueError("sampling (do_sample=True) needs a temperature above 0")
    return dataclasses.replace(params, **given) if given else params


def _prediction(value: Any) -> Any:
    """A prediction as OpenAI's request field: a string is its content."""
    return {"type": "content", "content": value} if isinstance(value, str) else value


def _as_list(stop: Any) -> list[Any]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)
