"""Tool calling through a model's own chat template and output format.

Tools are OpenAI-style function descriptions (``{"type": "function", "function": {"name",
"description", "parameters"}}``), the form ``apply_chat_template(..., tools=...)`` takes. A
model's format is read off its chat template by rendering a probe conversation (a tool and a
call to it) and looking at how the call comes out:

- ``"smollm2"``: ``<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>``, the SmolLM2
  family's (the default model ships a template for it, ``smollm2-tools.jinja``);
- ``"hermes"``: one ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` per call
  (Hermes 2 Pro, Qwen 2.5 / 3);
- ``"llama3"``: the reply is a bare ``{"name": ..., "parameters": {...}}`` (Llama 3.1 / 3.2 / 3.3).

`ToolFormat.parse` turns a generated text into content and `ToolCall` s (each with a fresh id);
`ToolFormat.grammar` is the `Grammar` that forces a call to one named tool or to any of them.
`ToolFormat.one_call` is the format that keeps a reply's first call only (OpenAI's
``parallel_tool_calls: false``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rag_lookahead.structured.grammar import Grammar

__all__ = [
    "InvalidToolCall",
    "ParsedReply",
    "ToolCall",
    "ToolFormat",
    "ToolFormatName",
    "ToolsNotSupportedError",
    "check_tools",
    "detect_tool_format",
    "new_call_id",
    "template_messages",
    "tool_choice",
    "tool_names",
]

ToolFormatName = Literal["smollm2", "hermes", "llama3"]


class ToolsNotSupportedError(ValueError):
    """The model's chat template renders no tools, or calls in no format this module reads."""


def new_call_id() -> str:
    """A fresh tool call id (``call_`` and 24 hex digits, as OpenAI's look)."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: the tool's name, its arguments, and an id for its result."""

    name: str
    arguments: Mapping[str, Any]
    id: str = field(default_factory=new_call_id)

    def as_message_call(self) -> dict[str, Any]:
        """The call as an assistant message's ``tool_calls`` item (OpenAI's shape)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": dict(self.arguments)},
        }


@dataclass(frozen=True)
class InvalidToolCall:
    """Generated text that opened a tool call but does not parse as one (``error`` says why)."""

    text: str
    error: str
    name: str | None = None
    id: str = field(default_factory=new_call_id)


@dataclass(frozen=True)
class ParsedReply:
    """A generated reply split into its text and its tool calls.

    Attributes:
        content: The text outside the tool call blocks (stripped).
        calls: The calls that parsed, in order.
        invalid: The blocks that opened a call but did not parse (cut off, malformed JSON...).
    """

    content: str
    calls: tuple[ToolCall, ...] = ()
    invalid: tuple[InvalidToolCall, ...] = ()


_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def check_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``tools`` as OpenAI-style function tools, or a clear error.

    Each is ``{"type": "function", "function": {"name", "description"?, "parameters"?}}``;
    a bare ``{"name", "description"?, "parameters"?}`` is wrapped. Names are unique and
    ``parameters`` is a JSON schema object (``{"type": "object", "properties": {}}`` if absent).
    """
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools are a sequence of tool descriptions, got {type(tools).__name__}")
    checked = [_check_tool(tool, i) for i, tool in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"tool names must be unique; repeated: {duplicated}")
    return checked


def _check_tool(tool: object, index: int) -> dict[str, Any]:
    if not isinstance(tool, Mapping):
        raise TypeError(
            f"tool {index} is a mapping (an OpenAI-style function tool), got {type(tool).__name__}"
        )
    if "function" in tool:
        if tool.get("type", "function") != "function":
            raise ValueError(
                f"tool {index} has type {tool.get('type')!r}; only 'function' tools are supported"
            )
        function = tool["function"]
    else:
        function = tool
    if not isinstance(function, Mapping):
        raise TypeError(f"tool {index}'s function is a mapping, got {type(function).__name__}")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"tool {index} needs a name of 1-64 letters, digits, '_', '.' or '-', got {name!r}")
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, Mapping):
        raise TypeError(
            f"tool {name!r}'s parameters are a JSON schema object, got {type(parameters).__name__}"
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise TypeError(f"tool {name!r}'s description is a string, got {type(description).__name__}")
    out: dict[str, Any] = {"name": name}
    if description:
        out["description"] = description
    out["parameters"] = _json_copy(parameters, f"tool {name!r}'s parameters")
    return {"type": "function", "function": out}


def _json_copy(value: Mapping[str, Any], what: str) -> dict[str, Any]:
    try:
        copied: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what} cannot be written as JSON: {err}") from None
    return copied


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of checked ``tools`` (see `check_tools`)."""
    return [t["function"]["name"] for t in tools]


_FORCED: dict[object, str] = {"any": "any", "required": "any", True: "any"}


def tool_choice(choice: object, names: Sequence[str]) -> str:
    """A ``tool_choice`` as the ecosystems write it, normalised: ``"auto"`` (``None``,
    ``"auto"``: the model decides), ``"none"`` (``"none"``, ``False``: no tools in the prompt),
    ``"any"`` (``"any"``, ``"required"``, ``True``: one call to one of them, forced), or one of
    ``names`` (given as is or as OpenAI's ``{"type": "function", "function": {"name": ...}}``:
    one call to it, forced); anything else, or a forced call with no tools, is a clear error."""
    if isinstance(choice, Mapping):  # a mapping without a name falls through to the error
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        choice = name if isinstance(name, str) else choice
    if choice is None or choice == "auto":
        return "auto"
    if choice is False or choice == "none":
        return "none"
    if isinstance(choice, (str, bool)) and choice in _FORCED:
        forced = _FORCED[choice]
    elif isinstance(choice, str) and choice in names:
        forced = choice
    else:
        raise ValueError(
            "tool_choice is 'auto', 'any' (or 'required', True), 'none', or the name of a given "
            f"tool ({list(names)}); got {choice!r}"
        )
    if not names:
        raise ValueError(f"tool_choice={choice!r} forces a tool call, but no tools are given")
    return forced


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as chat templates expect them.

    An assistant message's ``tool_calls`` become OpenAI-shaped items whose ``arguments`` are a
    mapping (templates write them with ``tojson``; a JSON string is parsed); other messages are
    copied as they are.
    """
    out = []
    for i, message in enumerate(messages):
        copied = dict(message)
        calls = copied.get("tool_calls")
        if calls:
            if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Sequence):
                raise TypeError(f"message {i}'s tool_calls are a sequence, got {type(calls).__name__}")
            copied["tool_calls"] = [_template_call(call, i) for call in calls]
            if copied.get("content") is None:
                copied["content"] = ""
        out.append(copied)
    return out


def _template_call(call: object, index: int) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        raise TypeError(f"message {index}'s tool calls are mappings, got {type(call).__name__}")
    function = call.get("function", call)
    name, arguments = function.get("name"), function.get("arguments", function.get("args", {}))
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool call in message {index} has no name")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            raise ValueError(
                f"tool call {name!r} in message {index}: arguments are not JSON ({err})"
            ) from None
    if not isinstance(arguments, Mapping):
        raise ValueError(f"tool call {name!r} in message {index}: arguments are a JSON object")
    return {
        "id": str(call.get("id") or new_call_id()),
        "type": "function",
        "function": {"name": name, "arguments": dict(arguments)},
    }


# ---------------------------------------------------------------------------- formats


@dataclass(frozen=True)
class ToolFormat:
    """How a model writes tool calls.

    Attributes:
        name: ``"smollm2"``, ``"hermes"`` or ``"llama3"``.
        open: The text that opens a call block (empty for ``"llama3"``: the reply is the call).
        close: The text that closes it.
        arguments_key: The key of a call's arguments (``"arguments"``, Llama's ``"parameters"``).
        single_call: Whether `parse` keeps a reply's first call only (see `one_call`).
    """

    name: ToolFormatName
    open: str
    close: str
    arguments_key: str = "arguments"
    single_call: bool = False

    @classmethod
    def named(cls, name: ToolFormatName) -> ToolFormat:
        """The format ``name``."""
        if name not in _FORMATS:
            raise ValueError(f"tool formats are {sorted(_FORMATS)}, got {name!r}")
        return _FORMATS[name]

    def one_call(self) -> ToolFormat:
        """This format, parsing at most one call out of a reply (OpenAI's
        ``parallel_tool_calls: false``): the first; the calls after it are dropped, as vLLM
        drops them. A forced call needs no cut: its `grammar` allows exactly one call."""
        return replace(self, single_call=True)

    # ------------------------------------------------------------ grammar

    def call_schema(self, tool: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON schema of one call to ``tool`` (a checked tool): its name, then its arguments.

        The arguments take only the parameters the tool declares unless its schema says
        otherwise (``additionalProperties``): small models otherwise copy the prompt's example
        arguments into a forced call. The parameters' definitions (``$defs``, ``definitions``:
        pydantic's nested models) move to the call schema's root, where their refs point.
        """
        function = tool["function"]
        parameters, definitions = _nested(
            function["parameters"], f"/properties/{self.arguments_key}", f"tool {function['name']!r}"
        )
        if parameters.get("type", "object") == "object":
            parameters.setdefault("additionalProperties", False)
        return {
            "type": "object",
            "properties": {
                "name": {"const": function["name"]},
                self.arguments_key: parameters,
            },
            "required": ["name", self.arguments_key],
            "additionalProperties": False,
            **definitions,
        }

    def grammar(self, tools: Sequence[Mapping[str, Any]], name: str | None = None) -> Grammar:
        """What a reply must be to call tool ``name``, or any of ``tools`` when ``None``.

        One call, in the model's own block: ``tool_choice="any"`` or a tool's name. Each tool's
        call is a schema of its own, so tools whose definitions share a name keep their own.
        The grammar closes in budget (`Grammar.closes_in_budget`): a call that the tokens left
        can still complete is completed, its last string cut short, rather than cut off. The
        schemas' strings keep the lengths the tools declare: a default ``maxLength`` would cut
        an argument short even where the budget holds all of it.
        """
        checked = check_tools(tools)
        if not checked:
            raise ValueError("a forced tool call needs at least one tool")
        if name is not None:
            checked = [t for t in checked if t["function"]["name"] == name]
            if not checked:
                raise ValueError(f"no tool named {name!r}; tools: {tool_names(tools)}")
        calls = [Grammar.json_schema(self.call_schema(t)) for t in checked]
        call = calls[0] if len(calls) == 1 else Grammar.choice(*calls)
        if self.name == "smollm2":
            call = Grammar.sequence(
                Grammar.literal("<tool_call>[\n"), call, Grammar.literal("\n]</tool_call>")
            )
        elif self.name == "hermes":
            call = Grammar.sequence(Grammar.literal("<tool_call>\n"), call, Grammar.literal("\n</tool_call>"))
        return call.closing_in_budget()

    # ------------------------------------------------------------ parsing

    def parse(self, text: str, make_id: Callable[[], str] = new_call_id) -> ParsedReply:
        """Split a generated ``text`` into content and tool calls; ``make_id`` names each call
        (the first call alone for a `one_call` format)."""
        if not isinstance(text, str):
            raise TypeError(f"a reply is a str, got {type(text).__name__}")
        bare = self.name == "llama3"
        parsed = self._parse_bare(text, make_id) if bare else self._parse_blocks(text, make_id)
        if self.single_call and len(parsed.calls) > 1:
            return replace(parsed, calls=parsed.calls[:1])
        return parsed

    def _parse_blocks(self, text: str, make_id: Callable[[], str]) -> ParsedReply:
        content: list[str] = []
        calls: list[ToolCall] = []
        invalid: list[InvalidToolCall] = []
        rest = text
        while (start := rest.find(self.open)) >= 0:
            content.append(rest[:start])
            body_start = start + len(self.open)
            end = self._block_end(rest, body_start)
            body = rest[body_start:] if end < 0 else rest[body_start:end]
            self._parse_block(body, end < 0, make_id, calls, invalid)
            rest = "" if end < 0 else rest[end + len(self.close) :]
        content.append(rest)
        return ParsedReply("".join(content).strip(), tuple(calls), tuple(invalid))

    def _block_end(self, text: str, body_start: int) -> int:
        """Where the block's closing marker starts, or -1 when it is not closed.

        The JSON is read first: a string value may itself hold the closing marker.
        """
        position = len(text) - len(text[body_start:].lstrip())
        try:
            _, position = json.JSONDecoder().raw_decode(text, position)
        except json.JSONDecodeError:
            return text.find(self.close, body_start)  # not JSON: the reason is reported then
        end = len(text) - len(text[position:].lstrip())
        return end if text.startswith(self.close, end) else text.find(self.close, position)

    def _parse_block(
        self,
        body: str,
        cut: bool,
        make_id: Callable[[], str],
        calls: list[ToolCall],
        invalid: list[InvalidToolCall],
    ) -> None:
        raw = f"{self.open}{body}" if cut else f"{self.open}{body}{self.close}"
        if cut:
            invalid.append(
                InvalidToolCall(raw, f"the tool call is not closed with {self.close!r}", id=make_id())
            )
            return
        try:
            value = json.loads(body)
        except json.JSONDecodeError as err:
            invalid.append(InvalidToolCall(raw, f"the tool call is not valid JSON: {err}", id=make_id()))
            return
        items = value if isinstance(value, list) and self.name == "smollm2" else [value]
        for item in items:
            _add_call(item, self.arguments_key, raw, make_id, calls, invalid)

    def _parse_bare(self, text: str, make_id: Callable[[], str]) -> ParsedReply:
        body = text.strip()
        body = body.removeprefix(_PYTHON_TAG).strip()
        if not body.startswith("{"):
            return ParsedReply(text.strip())
        calls: list[ToolCall] = []
        invalid: list[InvalidToolCall] = []
        decoder = json.JSONDecoder()
        position = 0
        # Llama 3 may write several calls, separated by ';' or new lines.
        while position < len(body):
            try:
                value, position = decoder.raw_decode(body, position)
            except json.JSONDecodeError as err:
                if not calls and not invalid and not _looks_like_call(body):
                    return ParsedReply(text.strip())  # JSON text that names no tool: content
                invalid.append(
                    InvalidToolCall(body[position:], f"the tool call is not valid JSON: {err}", id=make_id())
                )
                break
            if not calls and not invalid and not (isinstance(value, dict) and "name" in value):
                return ParsedReply(text.strip())
            _add_call(value, self.arguments_key, json.dumps(value), make_id, calls, invalid)
            position = len(body) - len(body[position:].lstrip(" \t\r\n;"))
        return ParsedReply("", tuple(calls), tuple(invalid))

    # ------------------------------------------------------------ streaming

    def content_end(self, text: str) -> int:
        """How much of a reply generated so far is surely content, not (part of) a call.

        A streaming adapter shows ``text[:content_end(text)]`` and holds the rest back until
        the reply ends (then `parse` decides).
        """
        if self.name == "llama3":
            head = text.lstrip()
            if not head or head.startswith(("{", _PYTHON_TAG)) or _PYTHON_TAG.startswith(head):
                return 0
            return len(text)
        start = text.find(self.open)
        if start >= 0:
            return start
        # A reply ending in the beginning of the opener may be opening a call.
        for size in range(min(len(self.open) - 1, len(text)), 0, -1):
            if self.open.startswith(text[-size:]):
                return len(text) - size
        return len(text)


_PYTHON_TAG = "<|python_tag|>"


def _nested(schema: Mapping[str, Any], pointer: str, what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``schema`` as the subschema at ``pointer`` of a new root, and the definitions it lifts there.

    A tool's parameters are a whole schema whose refs are read from its root (pydantic writes a
    nested model as ``{"$ref": "#/$defs/Address"}``); inside a call schema that root is the
    call's. Its ``$defs`` / ``definitions`` move up to the new root, where their refs already
    point; any other local pointer (``#``, ``#/properties/...``) gets ``pointer`` in front.
    """
    for key in _DEFINITIONS:
        if key in schema and not isinstance(schema[key], Mapping):
            kind = type(schema[key]).__name__
            raise TypeError(f"{what}'s parameters: {key!r} is a mapping of named schemas, got {kind}")
    rebased = _rebased(schema, pointer)
    body = {k: v for k, v in rebased.items() if k not in _DEFINITIONS}
    return body, {k: v for k, v in rebased.items() if k in _DEFINITIONS}


_DEFINITIONS = ("$defs", "definitions")
# Keywords whose values are instances, not schemas: a {"$ref": ...} there is data; and those
# whose values map names (of properties, say, which may be "enum") to schemas.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
_NAMED_SCHEMAS = frozenset({*_DEFINITIONS, "properties", "patternProperties", "dependentSchemas"})


def _rebased(value: Any, pointer: str) -> Any:
    if isinstance(value, list):
        return [_rebased(v, pointer) for v in value]
    if not isinstance(value, Mapping):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in _DATA_KEYWORDS:
            out[key] = item
        elif key in _NAMED_SCHEMAS and isinstance(item, Mapping):
            out[key] = {name: _rebased(sub, pointer) for name, sub in item.items()}
        else:
            out[key] = _rebased(item, pointer)
    ref = out.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")) and not _into_definitions(ref):
        out["$ref"] = f"#{pointer}{ref[1:]}"
    return out


def _into_definitions(ref: str) -> bool:
    return ref.startswith(tuple(f"#/{key}/" for key in _DEFINITIONS))


def _looks_like_call(body: str) -> bool:
    return bool(re.match(r'\{\s*"name"\s*:', body))


def _add_call(
    item: object,
    arguments_key: str,
    raw: str,
    make_id: Callable[[], str],
    calls: list[ToolCall],
    invalid: list[InvalidToolCall],
) -> None:
    if not isinstance(item, dict):
        invalid.append(InvalidToolCall(raw, "a tool call is a JSON object", id=make_id()))
        return
    name = item.get("name")
    arguments = item.get(arguments_key, item.get("arguments", item.get("parameters", {})))
    if not isinstance(name, str) or not name:
        invalid.append(InvalidToolCall(raw, "the tool call has no name", id=make_id()))
    elif not isinstance(arguments, dict):
        invalid.append(
            InvalidToolCall(raw, f"the {arguments_key} of {name!r} are not a JSON object", name, make_id())
        )
    else:
        calls.append(ToolCall(name, arguments, make_id()))


_FORMATS: dict[str, ToolFormat] = {
    "smollm2": ToolFormat("smollm2", "<tool_call>", "</tool_call>"),
    "hermes": ToolFormat("hermes", "<tool_call>", "</tool_call>"),
    "llama3": ToolFormat("llama3", "", "", arguments_key="parameters"),
}

# ---------------------------------------------------------------------------- detection

_PROBE_TOOL = "lookahead_probe_tool"
_PROBE_ARG = "lookahead_probe_arg"
_PROBE_DESCRIPTION = "Lookahead probe description."
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": _PROBE_TOOL,
            "description": _PROBE_DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {_PROBE_ARG: {"type": "string", "description": "A probe."}},
                "required": [_PROBE_ARG],
            },
        },
    }
]
_PROBE_ID = "a1b2c3d4e"  # nine letters and digits: Mistral's templates insist on that
_PROBE_MESSAGES = [
    {"role": "user", "content": "Probe?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": _PROBE_ID,
                "type": "function",
                "function": {"name": _PROBE_TOOL, "arguments": {_PROBE_ARG: "v"}},
            }
        ],
    },
    {"role": "tool", "content": "probe result", "tool_call_id": _PROBE_ID, "name": _PROBE_TOOL},
]


def detect_tool_format(tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> ToolFormat:
    """The tool format of ``tokenizer``'s chat template, or `ToolsNotSupportedError` naming the model.

    The template renders a probe conversation (a tool, a call to it, its result); how the call
    comes out names the format.
    """
    model = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if not getattr(tokenizer, "chat_template", None):
        raise ToolsNotSupportedError(f"{model} has no chat template, so it cannot be given tools")
    try:
        rendered = tokenizer.apply_chat_template(
            _PROBE_MESSAGES, tools=_PROBE_TOOLS, tokenize=False, **dict(template_kwargs or {})
        )
    except Exception as err:  # a template's own raise_exception, or a renderer's TypeError
        raise ToolsNotSupportedError(f"the chat template of {model} cannot render tool calls: {err}") from err
    text = rendered if isinstance(rendered, str) else ""
    if _PROBE_DESCRIPTION not in text:
        raise ToolsNotSupportedError(
            f"the chat template of {model} has no tool support (it does not render the tools it is "
            "given); use a model whose template takes tools (Qwen 2.5/3, Hermes, Llama 3.1+, the "
            "default SmolLM2 model) or pass a tool-capable chat template"
        )
    if re.search(r"<tool_call>\s*\[", text):
        return _FORMATS["smollm2"]
    if re.search(r"<tool_call>\s*\{", text):
        return _FORMATS["hermes"]
    if re.search(rf'\{{"name": "{_PROBE_TOOL}", "parameters": ', text):
        return _FORMATS["llama3"]
    raise ToolsNotSupportedError(
        f"the chat template of {model} writes tool calls in a format rag-lookahead does not read "
        "(it reads SmolLM2's <tool_call>[...], Hermes/Qwen <tool_call>{...} and Llama 3 JSON)"
    )
