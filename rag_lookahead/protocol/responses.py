"""OpenAI's Responses API (``POST /v1/responses``), stateless, as the chat call it means.

A request is read as a ``/v1/chat/completions`` request (`plan_response`): ``instructions``
and the ``input`` items become chat messages (``function_call`` items an assistant's
``tool_calls``, ``function_call_output`` items tool messages), the flat function tools the
chat tools, ``text.format`` the ``response_format``, ``max_output_tokens`` the token budget;
the sampling options and the extensions (``documents``, ``corpus``, ``prediction``...) go to
`plan_chat` as they are. One prompt is formatted, and checked, one way whichever route asks.
The reply is the chat reply in the Responses shapes: the whole one read off the chat reply
(`response_object`), the streamed one off the chat chunks (`ResponseEvents`), so both say the
same text and the same calls. Nothing is stored: ``store: true`` and ``previous_response_id``
are refused.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rag_lookahead.config import GenerationParams
from rag_lookahead.interface import Engine
from rag_lookahead.protocol.errors import RequestError, checked_text
from rag_lookahead.protocol.replies import ReplyHeader, ReplyStream, usage
from rag_lookahead.protocol.requests import IGNORED_KEYS, CallPlan, plan_chat
from rag_lookahead.streaming.logprobs import TokenLogprob
from rag_lookahead.streaming.stats import DecodeStats

__all__ = ["ResponseEvents", "ResponsePlan", "plan_response", "response_header", "response_object"]

# Read here, and each turned into its chat counterpart (or refused).
_OWN_KEYS = frozenset(
    {
        *("input", "instructions", "max_output_tokens", "tools", "tool_choice", "text"),
        *("store", "previous_response_id", "include", "truncation", "background"),
    }
)
# Passed to the chat plan as they are: its rules accept or refuse them (the bookkeeping it
# checks and does not act on too, but ``store``, which this route reads itself).
_CHAT_KEYS = frozenset(
    {
        *("model", "temperature", "top_p", "stream", "seed", "top_k", "repetition_penalty"),
        *("documents", "corpus", "prediction", "parallel_tool_calls"),
    }
) | (IGNORED_KEYS - {"store"})
# Keys a client may send with the value that changes nothing: accepted with that value only.
_NEUTRAL: dict[str, object] = {"store": False, "truncation": "disabled", "background": False}
# OpenAI's own Responses parameters this route does not serve: refused with a value, but their
# null is OpenAI's default, which asks for nothing. Any other key's null is refused.
_UNSERVED = frozenset(
    {
        *("reasoning", "top_logprobs", "max_tool_calls", "prompt", "conversation", "stream_options"),
        *("context_management", "moderation", "prompt_cache_options", "prompt_cache_retention"),
    }
)
_ROLES = frozenset({"user", "assistant", "system", "developer"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_PART_KEYS = frozenset({"type", "text", "annotations", "logprobs"})
_ITEM_KEYS = {
    "message": frozenset({"type", "role", "content", "id", "status"}),
    "function_call": frozenset({"type", "call_id", "name", "arguments", "id", "status"}),
    "function_call_output": frozenset({"type", "call_id", "output", "id", "status"}),
}
_CHAT_USAGE = frozenset(
    {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    }
)
_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})
_FORMAT_KEYS = frozenset({"type", "name", "schema", "strict", "description"})
# A chat plan's parameter, as the Responses request names it (the longest prefix first).
_RENAMED = (
    ("messages", "input"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
)


@dataclass(frozen=True)
class ResponsePlan:
    """One Responses request: the chat call it means, and what its reply echoes.

    Attributes:
        call: The chat call (`plan_chat`'s plan of the request read as chat).
        settings: The settings every response object of the reply repeats (``instructions``,
            ``tools``, ``tool_choice``, ``temperature``, ``top_p``, ``text``...).
    """

    call: CallPlan
    settings: Mapping[str, Any]


def plan_response(
    request: Mapping[str, Any], engine: Engine, defaults: GenerationParams | None = None
) -> ResponsePlan:
    """A ``/v1/responses`` request as the chat call it means; ``defaults`` fill what it leaves
    out. A `RequestError` names the Responses parameter at fault."""
    body = _checked_keys(request)
    messages, sources = _messages(body.get("input"), body.get("instructions"))
    chat: dict[str, Any] = {key: body[key] for key in _CHAT_KEYS if key in body}
    chat["messages"] = messages
    if "max_output_tokens" in body:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if "tools" in body:
        chat["tools"] = _chat_tools(body["tools"])
    if "tool_choice" in body:
        chat["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    if "text" in body:
        chat["response_format"] = _response_format(body["text"])
    try:
        call = plan_chat(chat, engine, defaults)
    except RequestError as err:
        raise _renamed(err, sources) from None
    return ResponsePlan(call, _settings(body, call.params))


def response_header(model: str) -> ReplyHeader:
    """A fresh response id (``resp_...``), created now."""
    return ReplyHeader(f"resp_{uuid.uuid4().hex}", int(time.time()), model)


def response_object(plan: ResponsePlan, header: ReplyHeader, chat_reply: Mapping[str, Any]) -> dict[str, Any]:
    """The whole response to ``plan``, read off the reply its chat call got (`reply`)."""
    choice = chat_reply["choices"][0]
    message = choice["message"]
    status = _status(choice["finish_reason"])
    calls = [_call_item(call, f"fc_{uuid.uuid4().hex}") for call in message.get("tool_calls") or ()]
    output = []
    if message.get("content") or not calls or message.get("invalid_tool_calls"):
        item = _message_item(f"msg_{uuid.uuid4().hex}", message.get("content") or "", status)
        output.append(_with_invalid(item, message.get("invalid_tool_calls")))
    return _response(plan, header, status, [*output, *calls], _usage(chat_reply["usage"]))


class ResponseEvents:
    """The events of one streamed response, each with its ``sequence_number``: `start`, `add`
    for each piece of text, then `end` (or `failed`). The text and the calls are the chat
    stream's (`ReplyStream`): held back from where a call may begin, parsed at the end."""

    def __init__(self, plan: ResponsePlan, header: ReplyHeader) -> None:
        self._plan = plan
        self._header = header
        self._chat = ReplyStream(plan.call, header)
        self._sequence = 0
        self._output: list[dict[str, Any]] = []  # the items done
        self._message_id: str | None = None  # the message item open, if any
        self._text = ""

    def start(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``."""
        snapshot = _response(self._plan, self._header, "in_progress", [], None)
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def add(self, text: str, logprobs: Sequence[TokenLogprob] | None = None) -> list[dict[str, Any]]:
        """The events for ``text``, the next piece of the reply (none while it is held back)."""
        events: list[dict[str, Any]] = []
        for chunk in self._chat.add(text, logprobs):
            events += self._text_delta(chunk["choices"][0]["delta"].get("content") or "")
        return events

    def end(self, stats: DecodeStats) -> list[dict[str, Any]]:
        """The last events: the text held back, the message done, each call, then
        ``response.completed`` (``response.incomplete`` when the budget ran out)."""
        events: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        invalid = None
        finish = "stop"
        for chunk in self._chat.end(stats):
            choice = chunk["choices"][0]
            delta = choice["delta"]
            events += self._text_delta(delta.get("content") or "")
            calls += delta.get("tool_calls") or ()
            invalid = delta.get("invalid_tool_calls") or invalid
            finish = choice["finish_reason"] or finish
        status = _status(finish)
        if self._message_id is not None or not calls or invalid:
            events += self._message_done(status, invalid)
        for call in calls:
            events += self._call(call)
        response = _response(self._plan, self._header, status, self._output, _usage(usage(stats)))
        last = "response.completed" if status == "completed" else "response.incomplete"
        return [*events, self._event(last, response=response)]

    def failed(self, error: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The last events of a call that failed or was cut (``error`` is the server's error
        object, ``{"error": {...}}``): an ``error`` event, with the object kept whole for clients
        that read it there (the openai client raises on it, as on a chat stream's), then
        ``response.failed``, OpenAI's end of a response the server could not finish: status
        ``failed``, the output sent so far (a message cut short is ``incomplete``), and an
        ``error`` whose code is OpenAI's ``server_error`` (its codes have none of this server's)."""
        inner = error["error"]
        output = [*self._output]
        if self._message_id is not None:
            output.append(_message_item(self._message_id, self._text, "incomplete"))
        response = _response(self._plan, self._header, "failed", output, None)
        response["error"] = {"code": "server_error", "message": inner["message"]}
        return [
            self._event(
                "error",
                code=inner.get("code"),
                message=inner["message"],
                param=inner.get("param"),
                error=inner,
            ),
            self._event("response.failed", response=response),
        ]

    def _text_delta(self, piece: str) -> list[dict[str, Any]]:
        if not piece:
            return []
        events = self._message_open()
        self._text += piece
        where = self._where()
        events.append(self._event("response.output_text.delta", **where, delta=piece, logprobs=[]))
        return events

    def _message_open(self) -> list[dict[str, Any]]:
        if self._message_id is not None:
            return []
        self._message_id = f"msg_{uuid.uuid4().hex}"
        item = {**_message_item(self._message_id, "", "in_progress"), "content": []}
        return [
            self._event("response.output_item.added", output_index=len(self._output), item=item),
            self._event("response.content_part.added", **self._where(), part=_text_part("")),
        ]

    def _message_done(self, status: str, invalid: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        events = self._message_open()
        assert self._message_id is not None
        where = self._where()
        item = _with_invalid(_message_item(self._message_id, self._text, status), invalid)
        events += [
            self._event("response.output_text.done", **where, text=self._text, logprobs=[]),
            self._event("response.content_part.done", **where, part=_text_part(self._text)),
            self._event("response.output_item.done", output_index=len(self._output), item=item),
        ]
        self._output.append(item)
        self._message_id = None
        return events

    def _call(self, call: Mapping[str, Any]) -> list[dict[str, Any]]:
        done = _call_item(call, f"fc_{uuid.uuid4().hex}")
        where = {"item_id": done["id"], "output_index": len(self._output)}
        self._output.append(done)
        return [
            self._event(
                "response.output_item.added",
                output_index=where["output_index"],
                item={**done, "arguments": "", "status": "in_progress"},
            ),
            self._event("response.function_call_arguments.delta", **where, delta=done["arguments"]),
            self._event(
                "response.function_call_arguments.done",
                **where,
                name=done["name"],
                arguments=done["arguments"],
            ),
            self._event("response.output_item.done", output_index=where["output_index"], item=done),
        ]

    def _where(self) -> dict[str, Any]:
        """Where the open message's text goes: its item, its index in the output, its part."""
        return {"item_id": self._message_id, "output_index": len(self._output), "content_index": 0}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event


# ---------------------------------------------------------------------------- keys


def _checked_keys(request: Mapping[str, Any]) -> dict[str, Any]:
    """The request's known keys with a value (``null`` is as absent, for a key this route or
    OpenAI's API knows), or the first bad one."""
    if not isinstance(request, Mapping):
        raise RequestError(f"the request body is a JSON object, got {type(request).__name__}")
    body: dict[str, Any] = {}
    for key, value in request.items():
        if value is None and key in _OWN_KEYS | _CHAT_KEYS | _UNSERVED:
            continue
        if key == "previous_response_id":
            raise RequestError(
                "previous_response_id is not supported: this server stores no responses; "
                "send the whole conversation as input items",
                key,
                "unsupported_parameter",
            )
        if key == "include":
            _check_include(value)
        elif key in _NEUTRAL and (value != _NEUTRAL[key] or type(value) is not type(_NEUTRAL[key])):
            why = " (nothing is stored here)" if key == "store" else ""
            raise RequestError(
                f"{key}={value!r} is not supported{why}: only {_NEUTRAL[key]!r}", key, "unsupported_value"
            )
        elif key not in _OWN_KEYS | _CHAT_KEYS:
            raise RequestError(
                f"unknown parameter {key!r}; known: {', '.join(sorted(_OWN_KEYS | _CHAT_KEYS))}",
                str(key),
                "unknown_parameter",
            )
        body[key] = value
    return body


def _check_include(value: object) -> None:
    """``include`` asks for output this server does not make: only an empty list is served."""
    if not isinstance(value, list):
        raise RequestError("include is a list", "include")
    if value:
        raise RequestError(
            f"include={value!r} is not supported: a response has its text and calls only",
            "include",
            "unsupported_value",
        )


def _renamed(err: RequestError, sources: Sequence[str]) -> RequestError:
    """The chat plan's ``err`` naming the Responses parameter: a message by the input item
    (or the instructions) it came from."""
    param = err.param
    if param is not None and param.startswith("messages["):
        index = int(param[len("messages[") : param.index("]")])
        param = sources[index] if index < len(sources) else "input"
    elif param is not None:
        for chat, responses in _RENAMED:
            if param == chat or param.startswith(f"{chat}."):
                param = responses + param[len(chat) :]
                break
    return RequestError(err.message, param, err.code)


# ---------------------------------------------------------------------------- input


def _messages(value: object, instructions: object) -> tuple[list[dict[str, Any]], list[str]]:
    """``instructions`` and the ``input`` as chat messages, and each message's source (the
    request parameter it came from)."""
    messages: list[dict[str, Any]] = []
    sources: list[str] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError("instructions are a string", "instructions")
        messages.append({"role": "system", "content": checked_text(instructions, "instructions")})
        sources.append("instructions")
    if value is None:
        raise RequestError("input is required", "input", "missing_parameter")
    if isinstance(value, str):
        messages.append({"role": "user", "content": checked_text(value, "input")})
        sources.append("input")
        return messages, sources
    if not isinstance(value, list) or not value:
        raise RequestError("input is a string or a non-empty list of input items", "input")
    for i, item in enumerate(value):
        where = f"input[{i}]"
        before = len(messages)
        _add_item(messages, item, where)
        sources += [where] * (len(messages) - before)
    return messages, sources


def _add_item(messages: list[dict[str, Any]], item: object, where: str) -> None:
    """Add input ``item`` to ``messages``: a message, or a call that joins the assistant
    message before it (or opens one), or a call's output as a tool message."""
    if not isinstance(item, Mapping):
        raise RequestError(f"{where} is an input item object, got {type(item).__name__}", where)
    given = {k: v for k, v in item.items() if v is not None}
    kind = given.get("type", "message")
    if kind not in _ITEM_KEYS:
        raise RequestError(
            f"{where}.type {kind!r} is not supported: input items are messages, function_call "
            "and function_call_output (nothing is stored here to refer to)",
            f"{where}.type",
            "unsupported_value",
        )
    unknown = sorted(set(given) - _ITEM_KEYS[kind])
    if unknown:
        raise RequestError(f"{where} has unknown key {unknown[0]!r}", f"{where}.{unknown[0]}")
    if kind == "message":
        role = given.get("role")
        if role not in _ROLES:
            raise RequestError(f"{where}.role is one of {sorted(_ROLES)}, got {role!r}", f"{where}.role")
        messages.append({"role": role, "content": _content(given.get("content"), f"{where}.content")})
    elif kind == "function_call":
        call = {
            "id": _string(given, "call_id", where),
            "type": "function",
            "function": {"name": _string(given, "name", where), "arguments": _arguments(given, where)},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    else:
        output = _content(given.get("output"), f"{where}.output")
        messages.append({"role": "tool", "tool_call_id": _string(given, "call_id", where), "content": output})


def _content(value: object, where: str) -> str:
    """A message's content (or a call's output) as text: a string or text parts."""
    if value is None:
        raise RequestError(f"{where} is required", where, "missing_parameter")
    if isinstance(value, str):
        return checked_text(value, where)
    if not isinstance(value, list):
        raise RequestError(f"{where} is a string or a list of input_text parts", where)
    texts = []
    for j, part in enumerate(value):
        here = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise RequestError(
                f"{here} is not a text part ({{'type': 'input_text', 'text': ...}}): text only",
                here,
                "unsupported_content",
            )
        unknown = sorted(set(part) - _PART_KEYS)
        if unknown:
            raise RequestError(f"{here} has unknown key {unknown[0]!r}", f"{here}.{unknown[0]}")
        texts.append(checked_text(part["text"], f"{here}.text"))
    return "".join(texts)


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError(f"{where}.{key} is a non-empty string", f"{where}.{key}")
    return checked_text(value, f"{where}.{key}")


def _arguments(item: Mapping[str, Any], where: str) -> str:
    """A call's arguments: a JSON object, as a string."""
    text = item.get("arguments")
    if not isinstance(text, str):
        raise RequestError(f"{where}.arguments is a JSON object as a string", f"{where}.arguments")
    checked_text(text, f"{where}.arguments")
    try:
        value = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError) as err:
        raise RequestError(f"{where}.arguments is not JSON ({err})", f"{where}.arguments") from None
    if not isinstance(value, Mapping):
        raise RequestError(f"{where}.arguments is a JSON object", f"{where}.arguments")
    return text


# ---------------------------------------------------------------------------- tools and format


def _chat_tools(value: object) -> list[dict[str, Any]]:
    """Flat function tools (``{"type": "function", "name", ...}``) in the chat shape."""
    if not isinstance(value, list):
        raise RequestError("tools are a list of function tools", "tools")
    tools = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise RequestError(f"{where} is a function tool object", where)
        given = {k: v for k, v in tool.items() if v is not None}
        if given.get("type") != "function":
            raise RequestError(
                f"{where}.type is 'function' (built-in tools are not served), got {given.get('type')!r}",
                f"{where}.type",
                "unsupported_value",
            )
        unknown = sorted(set(given) - _TOOL_KEYS)
        if unknown:
            raise RequestError(f"{where} has unknown key {unknown[0]!r}", f"{where}.{unknown[0]}")
        tools.append({"type": "function", "function": {k: v for k, v in given.items() if k != "type"}})
    return tools


def _chat_tool_choice(value: object) -> object:
    """``tool_choice`` in the chat shape: a function is named flat here, nested there."""
    if not isinstance(value, Mapping):
        return value  # "auto", "none", "required": the chat plan reads them
    if (
        value.get("type") != "function"
        or set(value) != {"type", "name"}
        or not isinstance(value["name"], str)
    ):
        raise RequestError(
            "tool_choice is 'auto', 'none', 'required' or {'type': 'function', 'name': ...}, "
            f"got {dict(value)!r}",
            "tool_choice",
        )
    return {"type": "function", "function": {"name": value["name"]}}


def _response_format(value: object) -> dict[str, Any]:
    """``text`` (``{"format": {...}}``) as the chat ``response_format``."""
    if not isinstance(value, Mapping) or set(value) - {"format"}:
        unknown = sorted(set(value) - {"format"}) if isinstance(value, Mapping) else []
        param = f"text.{unknown[0]}" if unknown else "text"
        raise RequestError("text is {'format': {'type': 'text' | 'json_object' | 'json_schema', ...}}", param)
    fmt = value.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind in ("text", "json_object") and set(fmt) == {"type"}:
        return {"type": kind}
    if kind != "json_schema" or set(fmt) - _FORMAT_KEYS:
        raise RequestError(
            "text.format is {'type': 'text'}, {'type': 'json_object'} or "
            "{'type': 'json_schema', 'name': ..., 'schema': {...}, 'strict': ...}",
            "text.format",
        )
    if not isinstance(fmt.get("schema"), Mapping):
        raise RequestError("a json_schema text.format has a schema object", "text.format.schema")
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


# ---------------------------------------------------------------------------- reply


def _settings(body: Mapping[str, Any], params: GenerationParams) -> dict[str, Any]:
    """What a response echoes of its request: the settings it was made with."""
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": params.max_new_tokens,
        "metadata": body.get("metadata", {}),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "store": False,
        "temperature": params.temperature if params.sampling else 0.0,
        "top_p": params.top_p,
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": [
            {"description": None, "parameters": None, "strict": None, **t} for t in body.get("tools", ())
        ],
        "truncation": "disabled",
        "background": False,
    }


def _response(
    plan: ResponsePlan,
    header: ReplyHeader,
    status: str,
    output: list[dict[str, Any]],
    used: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "id": header.id,
        "object": "response",
        "created_at": header.created,
        "status": status,
        "model": header.model,
        "output": list(output),
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "usage": used,
        **plan.settings,
    }


def _status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _usage(chat: Mapping[str, Any]) -> dict[str, Any]:
    """A chat reply's ``usage`` as a response's; the extensions (``lookahead``) kept."""
    return {
        "input_tokens": chat["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0, **chat.get("prompt_tokens_details", {})},
        "output_tokens": chat["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0, **chat.get("completion_tokens_details", {})},
        "total_tokens": chat["total_tokens"],
        **{k: v for k, v in chat.items() if k not in _CHAT_USAGE},
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [_text_part(text)],
    }


def _with_invalid(item: dict[str, Any], invalid: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """A message item with the blocks that opened a call but did not parse, as the chat reply
    keeps them (an extension: the Responses API has no place for them)."""
    return {**item, "invalid_tool_calls": list(invalid)} if invalid else item


def _call_item(call: Mapping[str, Any], item_id: str) -> dict[str, Any]:
    """A chat reply's tool call as a ``function_call`` output item."""
    function = call["function"]
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call["id"],
        "name": function["name"],
        "arguments": function["arguments"],
        "status": "completed",
    }
