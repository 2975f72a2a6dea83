"""An OpenAI-style request (``/v1/chat/completions`` or ``/v1/completions``) as one `CallPlan`.

Every key the request may hold is read here, once: a key this module does not know, or a
value it cannot honour, is a `RequestError` naming the parameter, never ignored. Values the
engine would only take as a default (``frequency_penalty: 0``...) are accepted as such.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rag_lookahead.config import GenerationParams
from rag_lookahead.interface import Engine
from rag_lookahead.prompts import Prompt
from rag_lookahead.protocol.errors import RequestError
from rag_lookahead.streaming.logprobs import MAX_TOP_LOGPROBS
from rag_lookahead.structured import (
    Grammar,
    ToolFormat,
    ToolsNotSupportedError,
    check_tools,
    detect_tool_format,
)
from rag_lookahead.structured import tool_choice as normalised_choice
from rag_lookahead.structured.tools import template_messages

__all__ = [
    "MAX_STOP_STRINGS",
    "CallKind",
    "CallPlan",
    "ToolPlan",
    "checked_text",
    "plan_body",
    "plan_chat",
    "plan_completion",
]

CallKind = Literal["chat", "completion"]

# Each stop string is searched for at every step: a bound keeps that cost a request's own.
MAX_STOP_STRINGS = 16

_COMMON_KEYS = frozenset(
    {
        *("model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream"),
        *("stream_options", "response_format", "documents", "top_k", "repetition_penalty"),
        *("corpus", "logprobs", "top_logprobs"),
    }
)
_CHAT_KEYS = _COMMON_KEYS | {"messages", "max_completion_tokens", "tools", "tool_choice"}
_COMPLETION_KEYS = _COMMON_KEYS | {"prompt"}
# Keys a client may send with the value that means "off": accepted with that value only.
_NEUTRAL: dict[str, object] = {
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "parallel_tool_calls": True,
}
_COMPLETION_NEUTRAL = {**_NEUTRAL, "echo": False, "best_of": 1}

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})


@dataclass(frozen=True)
class ToolPlan:
    """What a call does with tools.

    Attributes:
        tools: Checked OpenAI-style tools the chat template renders (none: a plain call).
        choice: The normalised ``tool_choice``: ``"auto"``, ``"any"``, ``"none"`` or a tool's name.
        format: The model's tool format when the reply is parsed for calls, else ``None``.
    """

    tools: tuple[dict[str, Any], ...] = ()
    choice: str = "auto"
    format: ToolFormat | None = None


@dataclass(frozen=True)
class CallPlan:
    """One engine call, read off a request.

    Attributes:
        kind: ``"chat"`` (messages in, an assistant message out) or ``"completion"`` (text).
        model: The model the request names, or ``None`` when it names none.
        prompt: Chat messages (a tuple of dicts), a text, or token ids (a tuple).
        params: Token choice, stopping and the grammar (a response format or a forced call).
        tools: The tools rendered into the prompt and how the reply is parsed for calls.
        documents: Texts the call drafts from besides its prompt.
        corpus: The id of a server's corpus the call drafts from too (the server resolves it).
        stream: Whether the reply streams as server-sent events.
        include_usage: Whether a streamed reply ends with a usage chunk.
    """

    kind: CallKind
    model: str | None
    prompt: Prompt
    params: GenerationParams
    tools: ToolPlan = field(default_factory=ToolPlan)
    documents: tuple[str, ...] = ()
    corpus: str | None = None
    stream: bool = False
    include_usage: bool = False

    def stream_kwargs(self) -> dict[str, Any]:
        """What ``engine.stream`` takes for this plan besides the prompt and the params."""
        kwargs: dict[str, Any] = {"documents": list(self.documents)}
        if self.tools.tools:
            kwargs["tools"] = list(self.tools.tools)
        return kwargs


def plan_chat(
    request: Mapping[str, Any], engine: Engine, defaults: GenerationParams | None = None
) -> CallPlan:
    """A ``/v1/chat/completions`` request as a plan; ``defaults`` fill what it leaves out."""
    body = _checked_keys(request, _CHAT_KEYS, _NEUTRAL)
    if not engine.chat:
        raise RequestError(
            "this model has no chat template: send a prompt to /v1/completions",
            "messages",
            "no_chat_template",
        )
    messages = _messages(body.get("messages"))
    return _requested(body, plan_body("chat", tuple(messages), body, engine, defaults))


def plan_completion(request: Mapping[str, Any], defaults: GenerationParams | None = None) -> CallPlan:
    """A ``/v1/completions`` request as a plan; ``defaults`` fill what it leaves out."""
    body = _checked_keys(request, _COMPLETION_KEYS, _COMPLETION_NEUTRAL)
    prompt = _prompt(body.get("prompt"))
    return _requested(body, plan_body("completion", prompt, body, None, defaults))


def plan_body(
    kind: CallKind,
    prompt: Prompt,
    body: Mapping[str, Any],
    engine: Engine | None,
    defaults: GenerationParams | None = None,
) -> CallPlan:
    """The plan of a call whose ``prompt`` is read and whose ``body`` holds only known keys:
    its params, tools (a chat's, read off ``engine``) and documents."""
    tools = _tool_plan(body.get("tools"), body.get("tool_choice"), engine) if kind == "chat" else ToolPlan()
    grammar = _response_format(body.get("response_format"))
    if grammar is not None and tools.tools:
        raise RequestError("a request takes tools or a response_format, not both", "response_format")
    max_tokens = _max_tokens(body.get("max_tokens"), body.get("max_completion_tokens"))
    return CallPlan(
        kind=kind,
        model=None,
        prompt=prompt,
        params=_params(
            body, defaults or GenerationParams(), max_tokens, grammar or _forced_grammar(tools), kind
        ),
        tools=tools,
        documents=_documents(body.get("documents")),
    )


def _requested(body: Mapping[str, Any], plan: CallPlan) -> CallPlan:
    """``plan`` with what only a request says: the model it names, the server's corpus it
    drafts from and how it streams."""
    stream, include_usage = _streaming(body.get("stream"), body.get("stream_options"))
    return replace(
        plan,
        model=_model(body.get("model")),
        corpus=_corpus(body.get("corpus")),
        stream=stream,
        include_usage=include_usage,
    )


# ---------------------------------------------------------------------------- keys


def _checked_keys(
    request: Mapping[str, Any], known: frozenset[str], neutral: Mapping[str, object]
) -> dict[str, Any]:
    """The request's known keys with a value (``null`` is as absent), or the first bad key."""
    if not isinstance(request, Mapping):
        raise RequestError(f"the request body is a JSON object, got {type(request).__name__}")
    body: dict[str, Any] = {}
    for key, value in request.items():
        if value is None:
            continue
        if key in neutral:
            if value != neutral[key] or isinstance(value, bool) != isinstance(neutral[key], bool):
                raise RequestError(
                    f"{key}={value!r} is not supported (only {neutral[key]!r})", key, "unsupported_value"
                )
            continue
        if key not in known:
            raise RequestError(
                f"unknown parameter {key!r}; known: {', '.join(sorted(known | set(neutral)))}",
                str(key),
                "unknown_parameter",
            )
        body[key] = value
    return body


def _model(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise RequestError(f"model is the served model's name, got {value!r}", "model")
    return value


# ---------------------------------------------------------------------------- prompts


def _messages(value: object) -> list[dict[str, Any]]:
    if value is None:
        raise RequestError("messages are required", "messages", "missing_parameter")
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or not value:
        raise RequestError("messages are a non-empty list of message objects", "messages")
    return [_message(message, f"messages[{i}]") for i, message in enumerate(value)]


def checked_text(text: str, where: str) -> str:
    """``text``, once it is text: JSON may escape a lone surrogate (``"\\ud800"``), which no
    tokenizer takes; a `RequestError` naming ``where`` then."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(
                f"{where} is not valid Unicode text (a lone surrogate, such as \\ud800)", where
            ) from None
    return text


def _checked_strings(value: object, where: str) -> None:
    """Every string inside ``value`` (keys too) checked by `checked_text`, as ``where``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            checked_text(item, where)
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def _message(message: object, where: str) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise RequestError(f"{where} is a message object, got {type(message).__name__}", where)
    given = {k: v for k, v in message.items() if v is not None}  # a client's echoed nulls
    unknown = sorted(set(given) - _MESSAGE_KEYS)
    if unknown:
        raise RequestError(f"{where} has unknown key {unknown[0]!r}", f"{where}.{unknown[0]}")
    role = given.get("role")
    if role not in _ROLES:
        raise RequestError(f"{where}.role is one of {sorted(_ROLES)}, got {role!r}", f"{where}.role")
    out: dict[str, Any] = {
        "role": _ROLES[role],
        "content": _content(given.get("content"), f"{where}.content"),
    }
    for key, allowed in (("name", None), ("tool_call_id", "tool"), ("tool_calls", "assistant")):
        if key in given:
            if allowed is not None and role != allowed:
                raise RequestError(f"only a {allowed} message has {key}", f"{where}.{key}")
            if key != "tool_calls" and not isinstance(given[key], str):
                raise RequestError(f"{where}.{key} is a string", f"{where}.{key}")
            _checked_strings(given[key], f"{where}.{key}")
            out[key] = given[key]
    if "tool_calls" in out:
        try:
            out = template_messages([out])[0]
        except (TypeError, ValueError) as err:
            raise RequestError(str(err), f"{where}.tool_calls") from None
    return out


def _content(value: object, where: str) -> str:
    """A message's content as text: a string, ``null`` (an assistant's calls), or text parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return checked_text(value, where)
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Sequence):
        raise RequestError(f"{where} is a string or a list of text parts", where)
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise RequestError(
                f"{where}[{j}] is not a text part ({{'type': 'text', 'text': ...}}): text only",
                f"{where}[{j}]",
                "unsupported_content",
            )
        texts.append(checked_text(part["text"], f"{where}[{j}].text"))
    return "".join(texts)


def _prompt(value: object) -> str | tuple[int, ...]:
    if value is None:
        raise RequestError("prompt is required", "prompt", "missing_parameter")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one prompt
    if isinstance(value, str):
        if not value:
            raise RequestError("prompt is empty", "prompt")
        return checked_text(value, "prompt")
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        return tuple(value)
    raise RequestError(
        "prompt is one non-empty string or one list of token ids (one prompt a request)", "prompt"
    )


def _documents(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
        raise RequestError("documents are a list of strings", "documents")
    return tuple(checked_text(text, f"documents[{i}]") for i, text in enumerate(value))


def _corpus(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise RequestError(f"corpus is a corpus id (from POST /v1/corpora), got {value!r}", "corpus")
    return value


# ---------------------------------------------------------------------------- generation


def _params(
    body: Mapping[str, Any],
    defaults: GenerationParams,
    max_tokens: int | None,
    grammar: Grammar | None,
    kind: CallKind,
) -> GenerationParams:
    fields: dict[str, Any] = {"grammar": grammar, **_logprobs(body, kind, defaults.logprobs)}
    if max_tokens is not None:
        fields["max_new_tokens"] = max_tokens
    if "temperature" in body:
        temperature = _number(body["temperature"], "temperature", 0.0, 2.0)
        # Temperature 0 is greedy decoding: the lossless path, token for token plain greedy.
        fields["do_sample"] = temperature > 0
        fields["temperature"] = temperature if temperature > 0 else 1.0
    if "top_p" in body:
        fields["top_p"] = _number(body["top_p"], "top_p", 0.0, 1.0, open_low=True)
    if "top_k" in body:
        fields["top_k"] = _integer(body["top_k"], "top_k", 1)
    if "repetition_penalty" in body:
        fields["repetition_penalty"] = _number(
            body["repetition_penalty"], "repetition_penalty", 0.0, None, open_low=True
        )
    if "seed" in body:
        fields["seed"] = _integer(body["seed"], "seed", 0, 2**64 - 1)
    if "stop" in body:
        fields["stop_strings"] = _stops(body["stop"])  # a request's stops replace the defaults
    _check_n(body.get("n"))
    try:
        return replace(defaults, **fields)
    except (TypeError, ValueError) as err:
        raise RequestError(str(err)) from None


def _logprobs(body: Mapping[str, Any], kind: CallKind, default: bool) -> dict[str, Any]:
    """``logprobs`` (true or false) and ``top_logprobs`` (0 to 20), as OpenAI's chat takes them;
    a completion's ``logprobs`` may also be an integer, OpenAI's legacy API: that many top tokens."""
    fields: dict[str, Any] = {}
    logprobs = body.get("logprobs")
    if kind == "completion" and isinstance(logprobs, int) and not isinstance(logprobs, bool):
        if "top_logprobs" in body:
            raise RequestError(
                "a completion's integer logprobs is its top_logprobs: give one", "top_logprobs"
            )
        fields["logprobs"], fields["top_logprobs"] = True, _integer(logprobs, "logprobs", 0, MAX_TOP_LOGPROBS)
    elif logprobs is not None:
        if not isinstance(logprobs, bool):
            kinds = "true, false or an integer" if kind == "completion" else "true or false"
            raise RequestError(f"logprobs is {kinds}, got {logprobs!r}", "logprobs")
        fields["logprobs"] = logprobs
    if "top_logprobs" in body:
        fields["top_logprobs"] = _integer(body["top_logprobs"], "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if fields["top_logprobs"] and not fields.get("logprobs", default):
            raise RequestError("top_logprobs needs logprobs=true", "top_logprobs")
    elif fields.get("logprobs") is False:
        fields["top_logprobs"] = 0  # over a default that asks for them
    return fields


def _max_tokens(max_tokens: object, max_completion_tokens: object) -> int | None:
    values = {
        name: _integer(value, name, 1)
        for name, value in (("max_tokens", max_tokens), ("max_completion_tokens", max_completion_tokens))
        if value is not None
    }
    if len(set(values.values())) > 1:
        raise RequestError(
            "max_tokens and max_completion_tokens disagree: give one of them", "max_completion_tokens"
        )
    return next(iter(values.values()), None)


def _number(value: object, name: str, low: float, high: float | None, *, open_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} must be a number, got {value!r}", name)
    too_low = value <= low if open_low else value < low
    if too_low or (high is not None and value > high):
        bounds = f"{'(' if open_low else '['}{low:g}, {'inf)' if high is None else f'{high:g}]'}"
        raise RequestError(f"{name} must be in {bounds}, got {value}", name)
    return float(value)


def _integer(value: object, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} is an integer, got {value!r}", name)
    if value < low or (high is not None and value > high):
        raise RequestError(
            f"{name} must be from {low} to {high if high is not None else 'any'}, got {value}", name
        )
    return value


def _stops(value: object) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop is a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop")
    return tuple(checked_text(stop, "stop") for stop in stops)


def _check_n(value: object) -> None:
    if value is not None and (isinstance(value, bool) or value != 1):
        raise RequestError(f"n={value!r} is not supported: one choice per request", "n", "unsupported_value")


def _streaming(stream: object, options: object) -> tuple[bool, bool]:
    """Whether the reply streams, and whether it ends with a usage chunk."""
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(f"stream is true or false, got {stream!r}", "stream")
    if options is None:
        return bool(stream), False
    if not stream:
        raise RequestError("stream_options need stream=true", "stream_options")
    if not isinstance(options, Mapping) or set(options) - {"include_usage"}:
        raise RequestError("stream_options is {'include_usage': true|false}", "stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise RequestError("stream_options.include_usage is true or false", "stream_options.include_usage")
    return True, usage


def _response_format(value: object) -> Grammar | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json().closing_in_budget()
    if kind == "json_schema":
        spec = value.get("json_schema") if isinstance(value, Mapping) else None
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise RequestError(
                "a json_schema response_format is {'type': 'json_schema', 'json_schema': {'schema': {...}}}",
                "response_format.json_schema.schema",
            )
        try:
            return Grammar.json_schema(schema).closing_in_budget()
        except (TypeError, ValueError) as err:
            raise RequestError(str(err), "response_format.json_schema.schema") from None
    raise RequestError(
        f"response_format is {{'type': 'text' | 'json_object' | 'json_schema', ...}}, got {value!r}",
        "response_format",
    )


# ---------------------------------------------------------------------------- tools


def _tool_plan(tools: object, choice: object, engine: Engine | None) -> ToolPlan:
    _checked_strings(tools, "tools")
    try:
        checked = check_tools(tools if tools is not None else [])  # type: ignore[arg-type]
    except (TypeError, ValueError) as err:
        raise RequestError(str(err), "tools") from None
    try:
        normalised = normalised_choice(choice, [t["function"]["name"] for t in checked])
    except ValueError as err:
        raise RequestError(str(err), "tool_choice") from None
    if not checked or normalised == "none":
        return ToolPlan(choice=normalised)
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        raise RequestError(
            f"tool calls need the model's chat template: {type(engine).__name__} has no tokenizer",
            "tools",
            "tools_not_supported",
        )
    try:
        fmt = detect_tool_format(tokenizer, getattr(engine, "chat_template_kwargs", None))
    except ToolsNotSupportedError as err:
        raise RequestError(str(err), "tools", "tools_not_supported") from None
    return ToolPlan(tuple(checked), normalised, fmt)


def _forced_grammar(tools: ToolPlan) -> Grammar | None:
    """The grammar of a forced call (``tool_choice`` ``"required"`` or a tool's name)."""
    if tools.format is None or tools.choice == "auto":
        return None
    return tools.format.grammar(tools.tools, None if tools.choice == "any" else tools.choice)
