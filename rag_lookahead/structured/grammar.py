"""What a constrained answer must match, said independently of the library that enforces it.

A `Grammar` is a small tree: JSON (any object, or one that validates against a JSON schema), a
regular expression, literal text, and sequences and choices of those. Tool calls are literal
markers around a JSON schema; structured output is a JSON schema alone. A grammar marked
`closes_in_budget` is also made to end within the call's ``max_new_tokens`` where it can.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Grammar", "GrammarKind"]

GrammarKind = Literal["json_schema", "json", "regex", "literal", "sequence", "choice"]


@dataclass(frozen=True)
class Grammar:
    """A constraint on the text a call generates; build it with the class methods.

    Attributes:
        kind: What ``value`` or ``parts`` hold.
        value: The JSON schema as JSON text (``"json_schema"``), the pattern (``"regex"``) or
            the text (``"literal"``); empty for the other kinds.
        parts: The grammars of a ``"sequence"`` (one after another) or ``"choice"`` (one of).
        closes_in_budget: Make the text end within the call's ``max_new_tokens`` where it can:
            once the tokens left reach what a short completion of the text so far takes
            (closing its strings, arrays and objects, minimal values for the required keys
            still missing, the literal parts after it, then the end-of-sequence token), that
            completion is forced (one of up to 256 tokens; a longer one is not sought). Read
            on the grammar a call is given, not on its parts. Forced tool calls
            (`ToolFormat.grammar`) are made this way; see `closing_in_budget`.
    """

    kind: GrammarKind
    value: str = ""
    parts: tuple[Grammar, ...] = ()
    closes_in_budget: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.closes_in_budget, bool):
            raise TypeError(f"closes_in_budget is True or False, got {self.closes_in_budget!r}")
        if self.kind in ("sequence", "choice"):
            if not self.parts or not all(isinstance(p, Grammar) for p in self.parts):
                raise ValueError(f"a {self.kind} grammar needs one or more Grammar parts")
            if self.value:
                raise ValueError(f"a {self.kind} grammar has parts, not a value")
            return
        if self.parts:
            raise ValueError(f"a {self.kind!r} grammar has no parts")
        if self.kind == "json_schema":
            _schema_object(self.value)
        elif self.kind == "regex":
            _pattern(self.value)
        elif self.kind == "literal":
            if not isinstance(self.value, str) or not self.value:
                raise ValueError("a literal grammar needs non-empty text")
        elif self.kind == "json":
            if self.value:
                raise ValueError("a json grammar takes no value (use Grammar.json_schema)")
        else:
            raise ValueError(
                "kind must be 'json_schema', 'json', 'regex', 'literal', 'sequence' or 'choice', "
                f"got {self.kind!r}"
            )

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str | type) -> Grammar:
        """JSON that validates against ``schema``: a mapping, its JSON text, or a pydantic model
        class (its ``model_json_schema()``; pydantic itself is not needed here)."""
        if isinstance(schema, type):
            schema = _model_schema(schema)
        text = schema if isinstance(schema, str) else _dumps(schema)
        return cls("json_schema", text)

    @classmethod
    def json(cls) -> Grammar:
        """Any JSON object (OpenAI's ``json_object`` response format)."""
        return cls("json")

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        """Text that ``pattern`` matches in full."""
        return cls("regex", pattern)

    @classmethod
    def literal(cls, text: str) -> Grammar:
        """Exactly ``text``."""
        return cls("literal", text)

    @classmethod
    def sequence(cls, *parts: Grammar) -> Grammar:
        """Each of ``parts`` in turn."""
        return cls("sequence", parts=tuple(parts))

    @classmethod
    def choice(cls, *parts: Grammar) -> Grammar:
        """One of ``parts``."""
        return cls("choice", parts=tuple(parts))

    def closing_in_budget(self) -> Grammar:
        """This grammar, made to end within the call's ``max_new_tokens`` where it can (see
        ``closes_in_budget``): a structured answer or a tool call that a small budget would
        otherwise cut off inside a string comes out complete, its last value shortened."""
        return dataclasses.replace(self, closes_in_budget=True)


def _model_schema(model: type) -> Mapping[str, Any]:
    make = getattr(model, "model_json_schema", None)
    if not callable(make):
        raise TypeError(f"a class given as a JSON schema must be a pydantic model, got {model.__name__}")
    schema: Mapping[str, Any] = make()
    return schema


def _dumps(schema: Mapping[str, Any]) -> str:
    if not isinstance(schema, Mapping):
        raise TypeError(f"a JSON schema is a mapping or its JSON text, got {type(schema).__name__}")
    try:
        return json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"the JSON schema cannot be written as JSON: {err}") from None


def _schema_object(text: object) -> None:
    if not isinstance(text, str):
        raise TypeError(f"a JSON schema is a mapping or its JSON text, got {type(text).__name__}")
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"the JSON schema is not valid JSON: {err}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON schema is a JSON object, got {type(schema).__name__}")


def _pattern(pattern: object) -> None:
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("a regex grammar needs a non-empty pattern")
    try:
        re.compile(pattern)
    except re.error as err:
        raise ValueError(f"the regular expression does not compile: {err}") from None
