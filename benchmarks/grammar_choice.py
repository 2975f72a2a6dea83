"""Which grammar library constrains decoding: llguidance, xgrammar or outlines-core.

On the default model's tokenizer, for each JSON schema of a coverage set (the shapes tool and
extraction schemas take: nesting, arrays, enums, anyOf, $defs, recursion, patterns, formats,
bounds, nullables, optional fields): does it compile, how long that takes, does the library
accept a valid instance token by token and end accepting, does it refuse an invalid one; then
the time per token of computing the allowed-token mask and advancing, which tree verification
pays at every draft node, and whether the matcher rolls back (the tree walk needs it).

Each library runs in a process of its own (their native threads and memory apart):

    python benchmarks/grammar_choice.py --json benchmarks/grammar-choice.json

Needs ``pip install llguidance xgrammar outlines-core`` (not the project's dependencies).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LIBRARIES = ("llguidance", "xgrammar", "outlines_core")

_PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "member": {"type": "boolean"}},
    "required": ["name", "age", "member"],
}
_DEFS = {
    "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    "type": "object",
    "properties": {"home": {"$ref": "#/$defs/Place"}, "work": {"$ref": "#/$defs/Place"}},
    "required": ["home", "work"],
}
_TREE = {
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {
                "label": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
            },
            "required": ["label", "children"],
        }
    },
    "$ref": "#/$defs/Node",
}
_TOOL_CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "search_documents"},
        "arguments": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "top_k": {"type": "integer", "minimum": 1, "maximum": 10},
            },
            "required": ["query"],
        },
    },
    "required": ["name", "arguments"],
}
# (name, schema, a valid instance, an invalid instance)
SCHEMAS: list[tuple[str, dict[str, Any], Any, Any]] = [
    (
        "flat object",
        _PERSON,
        {"name": "Ada Lovelace", "age": 36, "member": True},
        {"name": "Ada", "age": "36"},
    ),
    (
        "nested, array of objects",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "authors": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                },
            },
            "required": ["title", "authors"],
        },
        {"title": "On Computable Numbers", "authors": [{"name": "Alan Turing"}]},
        {"title": "x", "authors": [{"nom": "y"}]},
    ),
    (
        "enum and const",
        {
            "type": "object",
            "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "kind": {"const": "weather"}},
            "required": ["unit", "kind"],
        },
        {"unit": "celsius", "kind": "weather"},
        {"unit": "kelvin", "kind": "weather"},
    ),
    (
        "anyOf",
        {
            "type": "object",
            "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "string"}]}},
            "required": ["value"],
        },
        {"value": "twelve"},
        {"value": [12]},
    ),
    (
        "$defs and $ref",
        _DEFS,
        {"home": {"city": "Paris"}, "work": {"city": "Lyon"}},
        {"home": {"town": "Paris"}, "work": {}},
    ),
    (
        "recursive $ref",
        _TREE,
        {"label": "root", "children": [{"label": "leaf", "children": []}]},
        {"label": "root", "children": [{}]},
    ),
    (
        "string pattern and length",
        {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "note": {"type": "string", "maxLength": 12},
            },
            "required": ["code", "note"],
        },
        {"code": "ABC-1234", "note": "short"},
        {"code": "abc-12", "note": "short"},
    ),
    (
        "integer and number bounds",
        {
            "type": "object",
            "properties": {
                "count": {"type": "integer", "minimum": 1, "maximum": 5},
                "score": {"type": "number"},
            },
            "required": ["count", "score"],
        },
        {"count": 3, "score": 0.75},
        {"count": 9, "score": 0.75},
    ),
    (
        "formats (date-time, email)",
        {
            "type": "object",
            "properties": {
                "when": {"type": "string", "format": "date-time"},
                "who": {"type": "string", "format": "email"},
            },
            "required": ["when", "who"],
        },
        {"when": "2026-12-01T10:00:00Z", "who": "ada@example.org"},
        {"when": "yesterday", "who": "ada"},
    ),
    (
        "optional fields, no additional properties",
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "boolean"}},
            "required": ["a"],
            "additionalProperties": False,
        },
        {"a": "x", "c": False},
        {"a": "x", "d": 1},
    ),
    (
        "array bounds",
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}
            },
            "required": ["tags"],
        },
        {"tags": ["rag", "trie"]},
        {"tags": []},
    ),
    (
        "nullable",
        {"type": "object", "properties": {"middle": {"type": ["string", "null"]}}, "required": ["middle"]},
        {"middle": None},
        {"middle": 3},
    ),
    (
        "tool call (const name, arguments)",
        _TOOL_CALL,
        {"name": "search_documents", "arguments": {"query": "dedent", "top_k": 4}},
        {"name": "other", "arguments": {}},
    ),
]


class _Matcher:
    """One library behind four calls: compile, allowed (a bool mask), advance, rollback."""

    def __init__(self, library: str, tokenizer: Any) -> None:
        self.library = library
        self.tokenizer = tokenizer
        self.vocab = len(tokenizer)
        started = time.perf_counter()
        getattr(self, f"_setup_{library}")()
        self.setup_seconds = time.perf_counter() - started

    # -- llguidance
    def _setup_llguidance(self) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self._ll = llguidance
        self._lltok = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab)
        self._bits = llguidance.torch.allocate_token_bitmask(1, self.vocab)

    def _compile_llguidance(self, schema: str) -> None:
        grammar = self._ll.LLMatcher.grammar_from_json_schema(schema)
        self._m = self._ll.LLMatcher(self._lltok, grammar)
        if self._m.is_error():
            raise ValueError(self._m.get_error())

    def _mask_llguidance(self) -> Any:
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(self._m, self._bits, 0)
        return self._bits[0]

    def _advance_llguidance(self, token: int) -> bool:
        return bool(self._m.consume_token(token)) and not self._m.is_error()

    def _rollback_llguidance(self, n: int) -> None:
        self._m.rollback(n)

    def _done_llguidance(self) -> bool:
        return bool(self._m.is_accepting())

    # -- xgrammar
    def _setup_xgrammar(self) -> None:
        import xgrammar

        self._xg = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab)
        self._compiler = xgrammar.GrammarCompiler(info)
        self._bits = xgrammar.allocate_token_bitmask(1, self.vocab)

    def _compile_xgrammar(self, schema: str) -> None:
        self._m = self._xg.GrammarMatcher(self._compiler.compile_json_schema(schema))

    def _mask_xgrammar(self) -> Any:
        self._m.fill_next_token_bitmask(self._bits)
        return self._bits[0]

    def _advance_xgrammar(self, token: int) -> bool:
        return bool(self._m.accept_token(token))

    def _rollback_xgrammar(self, n: int) -> None:
        self._m.rollback(n)

    def _done_xgrammar(self) -> bool:
        return bool(self._m.is_completed())

    # -- outlines-core (regex from the schema; a DFA index over the vocabulary)
    def _setup_outlines_core(self) -> None:
        import outlines_core

        self._oc = outlines_core
        unicode_to_byte = {v: k for k, v in _bytes_to_unicode().items()}
        pieces: dict[bytes, list[int]] = {}
        eos = self.tokenizer.eos_token_id
        for piece, token in self.tokenizer.get_vocab().items():
            if token == eos:
                continue
            raw = (
                bytes(unicode_to_byte[c] for c in piece)
                if all(c in unicode_to_byte for c in piece)
                else piece.encode()
            )
            pieces.setdefault(raw, []).append(token)
        self._vocabulary = outlines_core.Vocabulary(eos, pieces)

    def _compile_outlines_core(self, schema: str) -> None:
        regex = self._oc.json_schema.build_regex_from_schema(schema)
        self._m = self._oc.Guide(self._oc.Index(regex, self._vocabulary), max_rollback=64)

    def _mask_outlines_core(self) -> Any:
        return self._m.get_tokens()

    def _advance_outlines_core(self, token: int) -> bool:
        if token not in self._m.get_tokens():
            return False
        self._m.advance(token)
        return True

    def _rollback_outlines_core(self, n: int) -> None:
        self._m.rollback_state(n)

    def _done_outlines_core(self) -> bool:
        return bool(self._m.is_finished()) or self.tokenizer.eos_token_id in self._m.get_tokens()

    def call(self, what: str, *args: Any) -> Any:
        return getattr(self, f"_{what}_{self.library}")(*args)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet (what byte-level BPE vocabularies are written in)."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            codes.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, codes), strict=True))


def _walk(matcher: _Matcher, tokens: list[int]) -> tuple[bool, list[float]]:
    """Mask then advance at every token; whether all were allowed, and each step's seconds."""
    seconds = []
    for token in tokens:
        started = time.perf_counter()
        matcher.call("mask")
        ok = matcher.call("advance", token)
        seconds.append(time.perf_counter() - started)
        if not ok:
            return False, seconds
    return True, seconds


def run_library(library: str, model_dir: str, repeat: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    matcher = _Matcher(library, tokenizer)
    results: dict[str, Any] = {"setup_seconds": matcher.setup_seconds, "schemas": {}}
    step_seconds: list[float] = []
    for name, schema, valid, invalid in SCHEMAS:
        entry: dict[str, Any] = {}
        text = json.dumps(schema)
        try:
            started = time.perf_counter()
            matcher.call("compile", text)
            entry["compile_seconds"] = time.perf_counter() - started
        except Exception as err:  # a library's refusal is a result here
            entry["error"] = f"{type(err).__name__}: {str(err)[:160]}"
            results["schemas"][name] = entry
            continue
        good = tokenizer(json.dumps(valid), add_special_tokens=False).input_ids
        bad = tokenizer(json.dumps(invalid), add_special_tokens=False).input_ids
        for _ in range(repeat):
            matcher.call("compile", text)
            accepted, seconds = _walk(matcher, good)
            step_seconds += seconds
        entry["accepts_valid"] = accepted and matcher.call("done")
        matcher.call("rollback", len(good) // 2)  # back half way, then on again: the same end
        again, _ = _walk(matcher, good[len(good) - len(good) // 2 :])
        entry["rollback_ok"] = again and matcher.call("done")
        matcher.call("compile", text)
        walked, _ = _walk(matcher, bad)
        entry["refuses_invalid"] = not (walked and matcher.call("done"))
        results["schemas"][name] = entry
    results["mask_and_advance_ms"] = {
        "median": 1000 * statistics.median(step_seconds),
        "p90": 1000 * statistics.quantiles(step_seconds, n=10)[-1],
        "steps": len(step_seconds),
    }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-dir", default=None, help="tokenizer directory (default: the converted default model)"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--library", choices=LIBRARIES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    model_dir = args.model_dir or _default_model_dir()
    if args.library:  # a child process: one library
        print(json.dumps(run_library(args.library, model_dir, args.repeat)))
        return
    out: dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(),
        "tokenizer": model_dir,
        "libraries": {},
    }
    for library in LIBRARIES:
        child = [
            sys.executable,
            __file__,
            "--library",
            library,
            "--model-dir",
            model_dir,
            "--repeat",
            str(args.repeat),
        ]
        done = subprocess.run(child, capture_output=True, text=True, check=False)
        if done.returncode:
            out["libraries"][library] = {"error": done.stderr.strip().splitlines()[-1:]}
        else:
            out["libraries"][library] = json.loads(done.stdout.strip().splitlines()[-1])
        out["libraries"][library]["version"] = _version(library)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


def _version(library: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(library.replace("_", "-"))
    except PackageNotFoundError:
        return "not installed"


def _default_model_dir() -> str:
    from rag_lookahead.models import default_model_dir

    return str(default_model_dir())  # converted from its GGUF file on first use


if __name__ == "__main__":
    main()
