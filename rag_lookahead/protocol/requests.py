"""An OpenAI-style request (``/v1/chat/completions`` or ``/v1/completions``) as one `CallPlan`.

Every key the request may hold is read here, once (the sampling options by
`rag_lookahead.protocol.sampling`): a key this module does not know, or a value it cannot
honour, is a `RequestError` naming the parameter, never ignored. Values the
engine would only take as a default (``frequency_penalty: 0``...) are accepted as such, and
the bookkeeping OpenAI documents as leaving the answer alone (`IGNORED_KEYS`: ``user``,
``metadata``, ``store: false``...) is checked and not acted on. The table of every OpenAI
parameter is in docs/serving/openai-server.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rag_lookahead.config import GenerationParams
from rag_lookahead.decoding.constraint import check_grammar
from rag_lookahead.interface import Engine
from rag_lookahead.prompts import Prompt
from rag_lookahead.protocol.errors import RequestError, checked_text
from rag_lookahead.protocol.sampling import openai_to_params
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
    "IGNORED_KEYS",
    "CallKind",
    "CallPlan",
    "ToolPlan",
    "checked_text",
    "plan_body",
    "plan_chat",
    "plan_completion",
    "prediction_text",
]

CallKind = Literal["chat", "completion"]

_COMMON_KEYS = frozenset(
    {
        *("model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream"),
        *("stream_options", "response_format", "documents", "top_k", "repetition_penalty"),
        *("corpus", "logprobs", "top_logprobs", "prediction", "logit_bias", "parallel_tool_calls"),
    }
)
_CHAT_KEYS = _COMMON_KEYS | {"messages", "max_completion_tokens", "tools", "tool_choice"}
_COMPLETION_KEYS = _COMMON_KEYS | {"prompt", "echo"}
# Keys a client may send with the value that means "off": accepted with that value only.
_NEUTRAL: dict[str, object] = {
    "frequency_penalty": 0,
    "presence_penalty": 0,
}
_COMPLETION_NEUTRAL = {**_NEUTRAL, "best_of": 1}

# OpenAI's own parameters this server does not serve (docs/serving/openai-server.md's table):
# refused with a value, but their null is OpenAI's default, which asks for nothing. Any other
# key's null is refused as its value would be: it cannot be known to change nothing.
_UNSERVED = frozenset(
    {
        *("audio", "reasoning_effort", "verbosity", "web_search_options", "moderation", "suffix"),
        *("functions", "function_call", "prompt_cache_options", "prompt_cache_retention"),
    }
)

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
        prediction: Text the answer is expected to copy (OpenAI's Predicted Outputs), drafted
            from first; ``None`` when the request predicts nothing.
        corpus: The id of a server's corpus the call drafts from too (the server resolves it).
        stream: Whether the reply streams as server-sent events.
        include_usage: Whether a streamed reply ends with a usage chunk.
        echo: Whether a completion's reply starts with its prompt (OpenAI's ``echo``), the
            prompt's tokens' log probabilities with it when the call asks for log probabilities.
        echo_only: Whether the call generates nothing (``max_tokens: 0``, with ``echo``): its
            reply is the prompt echoed.
    """

    kind: CallKind
    model: str | None
    prompt: Prompt
    params: GenerationParams
    tools: ToolPlan = field(default_factory=ToolPlan)
    documents: tuple[str, ...] = ()
    prediction: str | None = None
    corpus: str | None = None
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    echo_only: bool = False

    def stream_kwargs(self) -> dict[str, Any]:
        """What ``engine.stream`` takes for this plan besides the prompt and the params."""
        kwargs: dict[str, Any] = {"documents": list(self.documents)}
        if self.tools.tools:
            kwargs["tools"] = list(self.tools.tools)
        if self.prediction:
            kwargs["prediction"] = self.prediction
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
    _check_legacy_logprobs(body.get("logprobs"))
    prompt = _prompt(body.get("prompt"))
    echo, echo_only = _echo(body)
    if echo_only:
        body = {key: value for key, value in body.items() if key != "max_tokens"}
    plan = _requested(body, plan_body("completion", prompt, body, None, defaults))
    if echo and plan.stream:
        raise RequestError("echo is not streamed: send it with stream=false", "echo", "unsupported_value")
    return replace(plan, echo=echo, echo_only=echo_only)


def plan_body(
    kind: CallKind,
    prompt: Prompt,
    body: Mapping[str, Any],
    engine: Engine | None,
    defaults: GenerationParams | None = None,
) -> CallPlan:
    """The plan of a call whose ``prompt`` is read and whose ``body`` holds only known keys:
    its params, tools (a chat's, read off ``engine``) and documents."""
    parallel = _parallel_tool_calls(body.get("parallel_tool_calls", True))
    tools = ToolPlan()
    if kind == "chat":
        tools = _tool_plan(body.get("tools"), body.get("tool_choice"), engine, parallel)
    grammar = _response_format(body.get("response_format"))
    if grammar is not None and tools.tools:
        raise RequestError("a request takes tools or a response_format, not both", "response_format")
    params = openai_to_params(
        body, defaults or GenerationParams(), grammar or _forced_grammar(tools), chat=kind == "chat"
    )
    return CallPlan(
        kind=kind,
        model=None,
        prompt=prompt,
        params=params,
        tools=tools,
        documents=_documents(body.get("documents")),
        prediction=prediction_text(body.get("prediction")),
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
    """The request's known keys with a value (``null`` is as absent, for a key this server
    or OpenAI's API knows), or the first bad key; the bookkeeping (`IGNORED_KEYS`) checked and
    left out."""
    if not isinstance(request, Mapping):
        raise RequestError(f"the request body is a JSON object, got {type(request).__name__}")
    body: dict[str, Any] = {}
    for key, value in request.items():
        if value is None and (key in known or key in neutral or key in _IGNORED or key in _UNSERVED):
            continue
        if key in _IGNORED:
            _IGNORED[key](key, value)
            continue
        if key in neutral:
            if value != neutral[key] or isinstance(value, bool) != isinstance(neutral[key], bool):
                raise RequestError(
                    f"{key}={value!r} is not supported (only {neutral[key]!r})", key, "unsupported_value"
                )
            continue
        if key not in known:
            raise RequestError(
                f"unknown parameter {key!r}; known: {', '.join(sorted(known | set(neutral) | IGNORED_KEYS))}",
                str(key),
                "unknown_parameter",
            )
        body[key] = value
    return body


def _text_id(key: str, value: object) -> None:
    if not isinstance(value, str):
        raise RequestError(f"{key} is a string, got {value!r}", key)


def _metadata(key: str, value: object) -> None:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise RequestError(f"{key} is an object of string keys and string values", key)


def _store(key: str, value: object) -> None:
    if value is not False:
        raise RequestError(
            f"store={value!r} is not supported: this server stores no completion (only false)",
            key,
            "unsupported_value",
        )


_SERVICE_TIERS = frozenset({"auto", "default", "flex", "scale", "priority", "fast"})


def _service_tier(key: str, value: object) -> None:
    if value not in _SERVICE_TIERS:
        raise RequestError(f"{key} is one of {sorted(_SERVICE_TIERS)}, got {value!r}", key)


def _modalities(key: str, value: object) -> None:
    if not isinstance(value, (list, tuple)) or list(value) != ["text"]:
        raise RequestError(
            f"modalities={value!r} is not supported: this server answers in text only (only ['text'])",
            key,
            "unsupported_value",
        )


# Bookkeeping that OpenAI documents as leaving the answer alone: who asks (``user`` and its
# successors ``safety_identifier``, ``prompt_cache_key``), tags, storage, the processing
# tier, text output. Each is checked by its function, then not acted on.
_IGNORED: Mapping[str, Callable[[str, object], None]] = {
    "user": _text_id,
    "safety_identifier": _text_id,
    "prompt_cache_key": _text_id,
    "metadata": _metadata,
    "store": _store,
    "service_tier": _service_tier,
    "modalities": _modalities,
}
#: The keys every request accepts, checked, and does not act on.
IGNORED_KEYS = frozenset(_IGNORED)


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


def _check_legacy_logprobs(value: object) -> None:
    """A completion request's ``logprobs`` is OpenAI's legacy integer (how many top tokens to
    list), as OpenAI types it: a boolean is the chat form, whose ``true`` says no count."""
    if isinstance(value, bool):
        raise RequestError(
            f"a completion's logprobs is an integer from 0 to {MAX_TOP_LOGPROBS}, how many of the "
            f"likeliest tokens to list (OpenAI's legacy API), got {str(value).lower()}: 0 lists "
            f"each token's own log probability alone",
            "logprobs",
        )


def _echo(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether a completion echoes its prompt, and whether it only echoes (``max_tokens: 0``,
    which generates nothing: only with ``echo``)."""
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise RequestError(f"echo is true or false, got {echo!r}", "echo")
    max_tokens = body.get("max_tokens")
    nothing = isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens == 0
    if nothing and not echo:
        raise RequestError(
            "max_tokens=0 generates nothing: it needs echo=true (to score the prompt)", "max_tokens"
        )
    return echo, nothing


def _documents(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
        raise RequestError("documents are a list of strings", "documents")
    return tuple(checked_text(text, f"documents[{i}]") for i, text in enumerate(value))


def prediction_text(value: object, where: str = "prediction") -> str | None:
    """OpenAI's ``prediction`` (``{"type": "content", "content": text | [text parts]}``) as
    its text; ``None`` for none (an empty text predicts nothing either)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("type") != "content" or set(value) != {"type", "content"}:
        raise RequestError(
            "prediction is {'type': 'content', 'content': text or a list of text parts}", where
        )
    return _content(value["content"], f"{where}.content") or None


def _corpus(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise RequestError(f"corpus is a corpus id (from POST /v1/corpora), got {value!r}", "corpus")
    return value


# ---------------------------------------------------------------------------- streaming and format


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
            grammar = Grammar.json_schema(schema).closing_in_budget()
            check_grammar(grammar)  # here, not as the call starts: the error names the schema
        except (TypeError, ValueError) as err:
            raise RequestError(str(err), "response_format.json_schema.schema") from None
        return grammar
    raise RequestError(
        f"response_format is {{'type': 'text' | 'json_object' | 'json_schema', ...}}, got {value!r}",
        "response_format",
    )


# ---------------------------------------------------------------------------- tools


def _parallel_tool_calls(value: object) -> bool:
    if not isinstance(value, bool):
        raise RequestError(f"parallel_tool_calls is true or false, got {value!r}", "parallel_tool_calls")
    return value


def _tool_plan(tools: object, choice: object, engine: Engine | None, parallel: bool = True) -> ToolPlan:
    """The call's tools, and the format its reply is parsed in: keeping only the first call
    unless ``parallel`` (a forced call's grammar allows one call either way)."""
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
    return ToolPlan(tuple(checked), normalised, fmt if parallel else fmt.one_call())


def _forced_grammar(tools: ToolPlan) -> Grammar | None:
    """The grammar of a forced call (``tool_choice`` ``"required"`` or a tool's name)."""
    if tools.format is None or tools.choice == "auto":
        return None
    return tools.format.grammar(tools.tools, None if tools.choice == "any" else tools.choice)
