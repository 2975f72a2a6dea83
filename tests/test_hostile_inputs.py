"""Hostile input, as a user might send it: each case gets a clear error and loses nothing.

The table grows with every case found: a name, what is done, the error expected and the words
its message must hold. After each one the engine still answers, and no call's branches linger.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine, TokenTrie
from rag_lookahead.decoding.acceptance import AcceptanceModel, load_acceptance
from rag_lookahead.decoding.planner import StepPlanner
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.structured import ToolFormat, ToolFormatName
from rag_lookahead.testing import VOCAB, CharTokenizer, grammar_accepts, greedy_reference, tiny_model

PROMPT = [3, 14, 15, 9, 26]
N = 8


@pytest.fixture
def engine() -> LookaheadEngine:
    return LookaheadEngine(
        tiny_model("llama"), CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1)
    )


def complete(**kwargs: Any) -> Callable[[LookaheadEngine], object]:
    prompt = kwargs.pop("prompt", PROMPT)
    return lambda engine: engine.complete(prompt, max_new_tokens=N, **kwargs)


def trie_file(tmp_path: Path, **changes: Any) -> Path:
    payload = {"format": "rag-lookahead-trie", "version": 1, "max_query_length": 2, "branch_length": 4}
    payload |= {"max_nodes": 1000, "nodes": [[5, -1, {"a": 1}]], **changes}
    path = tmp_path / "trie.json"
    path.write_text(json.dumps(payload))
    return path


def closed_scope(engine: LookaheadEngine) -> object:
    scope = engine.scope(["一丁七"])
    scope.close()
    return engine.complete(PROMPT, max_new_tokens=N, scope=scope)


def foreign_scope(engine: LookaheadEngine) -> object:
    other = LookaheadEngine(engine.model, engine.tokenizer, engine.config)
    with other.scope(["一丁七"]) as scope:
        return engine.complete(PROMPT, max_new_tokens=N, scope=scope)


# (case, action on the engine, error, words of its message)
ENGINE_CASES: list[tuple[str, Callable[[LookaheadEngine], object], type[Exception], str]] = [
    ("token id past the vocabulary", complete(prompt=[1, 2, VOCAB + 7]), ValueError, "outside the model's"),
    ("negative token id", complete(prompt=[-1, 2]), ValueError, "outside the model's"),
    ("empty prompt", complete(prompt=""), ValueError, "the prompt is empty"),
    ("prompt of another type", complete(prompt=3.5), TypeError, "a prompt is a str"),
    ("prompt past the context window", complete(prompt=[1] * 600), ValueError, "context window"),
    ("None among the documents", complete(documents=[None]), TypeError, "documents must be strings"),
    ("documents not a list", complete(documents=5), TypeError, "documents must be strings"),
    ("empty stop string", complete(stop_strings=[""]), ValueError, "non-empty strings"),
    ("None among stop strings", complete(stop_strings=["a", None]), ValueError, "non-empty strings"),
    ("seed past 64 bits", complete(do_sample=True, seed=2**70), ValueError, "seed must be an integer"),
    ("negative seed", complete(do_sample=True, seed=-1), ValueError, "seed must be an integer"),
    ("seed True", complete(seed=True), ValueError, "seed must be an integer"),
    ("temperature 0", complete(temperature=0), ValueError, "temperature must be > 0"),
    ("temperature a string", complete(temperature="hot"), ValueError, "temperature must be a finite number"),
    ("top_p 0", complete(top_p=0.0), ValueError, "top_p must be in"),
    ("top_p NaN", complete(top_p=float("nan")), ValueError, "top_p must be a finite number"),
    ("top_k 0", complete(top_k=0), ValueError, "top_k must be a positive integer"),
    ("repetition penalty 0", complete(repetition_penalty=0), ValueError, "repetition_penalty must be > 0"),
    (
        "max_new_tokens True",
        lambda e: e.complete(PROMPT, GenerationParams(max_new_tokens=True)),
        ValueError,
        "max_new_tokens must be a positive integer",
    ),
    ("do_sample a string", complete(do_sample="yes"), ValueError, "do_sample must be True or False"),
    ("eos a string", complete(eos_token_id="x"), ValueError, "eos_token_id must be a token id"),
    ("negative eos", complete(eos_token_id=[-3]), ValueError, "non-negative token ids"),
    ("unknown setting", complete(num_beams=4), TypeError, "unknown generation settings ['num_beams']"),
    ("closed scope", closed_scope, ValueError, "scope passed to this call is closed"),
    ("another engine's scope", foreign_scope, ValueError, "belongs to another engine"),
    (
        "generate with beams",
        lambda e: e.generate(torch.tensor([PROMPT]), num_beams=4),
        TypeError,
        "num_beams",
    ),
    ("generate on 1-D ids", lambda e: e.generate(torch.tensor(PROMPT)), ValueError, "input_ids must be"),
]

CONFIG_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown mode", {"mode": "fast"}, "mode must be"),
    ("no draft tokens", {"decoding_length": 0}, "decoding_length must be a positive integer"),
    ("a node cap of 10**40", {"max_trie_nodes": 10**40}, "max_trie_nodes must be at most"),
    ("a node cap as a float", {"max_trie_nodes": 2e5}, "max_trie_nodes must be a positive integer"),
    ("a batch of none", {"max_batch_size": 0}, "max_batch_size must be a positive integer"),
    (
        "a forward smaller than a batch",
        {"max_batch_size": 8, "max_tokens_per_forward": 4},
        "one token per row",
    ),
    ("n-grams past the budget", {"decoding_length": 2, "ngram_size": 5}, "more than decoding_length"),
    ("a negative prefix cache", {"prefix_cache_mb": -1}, "prefix_cache_mb must be from 0"),
    ("a prefix cache as a float", {"prefix_cache_mb": 0.5}, "prefix_cache_mb must be an integer"),
    ("a prefix cache as a bool", {"prefix_cache_mb": True}, "prefix_cache_mb must be an integer"),
]

TRIE_FILE_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("deeply nested JSON", lambda d: _write(d, "[" * 100_000 + "]" * 100_000), "not a readable trie file"),
    ("a node cap of 10**40", lambda d: trie_file(d, max_nodes=10**40), "bad trie settings"),
    ("a branch length of 10**9", lambda d: trie_file(d, branch_length=10**9), "bad trie settings"),
    ("settings as strings", lambda d: trie_file(d, max_query_length="2"), "bad trie settings"),
    ("a negative token", lambda d: trie_file(d, nodes=[[-5, -1, {"a": 1}]]), "bad token"),
    ("a boolean count", lambda d: trie_file(d, nodes=[[5, -1, {"a": True}]]), "count for 'a'"),
    ("a node before its parent", lambda d: trie_file(d, nodes=[[5, 0, {"a": 1}]]), "parent index"),
    ("nodes not a list", lambda d: trie_file(d, nodes={"5": 1}), "'nodes' must be a list"),
    ("a gzip that is not", lambda d: _write(d, "plain", "trie.json.gz"), "not a readable trie file"),
]


def acceptance_file(tmp_path: Path, **changes: Any) -> Path:
    payload = {"format": "rag-lookahead-acceptance", "version": 1, "key": {"model": "m"}}
    payload |= {"buckets": [["doc1", True, 3, 2.0, 5.0]], "scales": [["doc1", True, 2.0, 1.5, 5.0]]}
    payload |= changes
    path = tmp_path / "acceptance.json"
    path.write_text(json.dumps(payload))
    return path


# An acceptance table is a cache: a bad one is reported and learning starts afresh (outputs
# never depend on it), but it is never half-read.
ACCEPTANCE_FILE_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("not JSON", lambda d: _write(d, "{", "acceptance.json"), "not a readable acceptance table"),
    ("deeply nested JSON", lambda d: _write(d, "[" * 100_000 + "]" * 100_000, "acceptance.json"), "readable"),
    ("another format", lambda d: acceptance_file(d, format="rag-lookahead-trie"), "not an acceptance table"),
    ("buckets not a list", lambda d: acceptance_file(d, buckets={"doc1": 1}), "must be lists"),
    ("more hits than tries", lambda d: _bucket(d, ["doc1", True, 3, 9.0, 5.0]), "more nodes"),
    (
        "a negative count",
        lambda d: acceptance_file(d, scales=[["doc1", True, -1.0, 1.0, 2.0]]),
        "non-negative",
    ),
    ("a boolean count", lambda d: _bucket(d, ["doc1", True, 3, True, 5.0]), "non-negative"),
    ("a decile of 10", lambda d: _bucket(d, ["doc1", True, 10, 1.0, 5.0]), "decile"),
    ("a level as 1", lambda d: _bucket(d, ["doc1", 1, 3, 1.0, 5.0]), "first-level flag"),
    ("a huge source name", lambda d: _bucket(d, ["d" * 999, True, 3, 1.0, 5.0]), "source"),
    ("too many entries", lambda d: _bucket(d, ["doc1", True, 3, 1.0, 5.0], 10_001), "at most"),
]


def _bucket(tmp_path: Path, row: list[Any], copies: int = 1) -> Path:
    return acceptance_file(tmp_path, buckets=[row] * copies)


def _write(directory: Path, text: str, name: str = "trie.json") -> Path:
    path = directory / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("case", "action", "error", "words"), ENGINE_CASES, ids=[c[0] for c in ENGINE_CASES])
def test_a_hostile_call_is_refused_and_loses_nothing(engine, case, action, error, words) -> None:
    with pytest.raises(error) as raised:
        action(engine)
    assert words in str(raised.value), str(raised.value)
    assert engine.trie.owners() <= {OUTPUT_OWNER}  # nothing of the refused call lingers
    answer = engine.complete(PROMPT, max_new_tokens=N)  # and the engine still answers
    assert answer.token_ids == greedy_reference(engine.model, PROMPT, N)


@pytest.mark.parametrize(("case", "fields", "words"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_a_hostile_config_is_refused(case, fields, words) -> None:
    with pytest.raises(ValueError, match=None) as raised:
        LookaheadConfig(**fields)
    assert words in str(raised.value), str(raised.value)


@pytest.mark.parametrize(("case", "make", "words"), TRIE_FILE_CASES, ids=[c[0] for c in TRIE_FILE_CASES])
def test_a_hostile_trie_file_is_refused(tmp_path, case, make, words) -> None:
    path = make(tmp_path)
    with pytest.raises(ValueError) as raised:
        TokenTrie.load(path)
    assert words in str(raised.value), str(raised.value)


@pytest.mark.parametrize(
    ("case", "make", "words"), ACCEPTANCE_FILE_CASES, ids=[c[0] for c in ACCEPTANCE_FILE_CASES]
)
def test_a_hostile_acceptance_table_is_reported_and_not_used(tmp_path, case, make, words) -> None:
    path = make(tmp_path)
    model = AcceptanceModel()
    with pytest.raises(ValueError) as raised:
        load_acceptance(path, {"model": "m"}, model)
    assert words in str(raised.value), str(raised.value)
    assert model.state() == {"buckets": [], "scales": []}  # nothing half-read
    planner = StepPlanner(LookaheadConfig())
    with pytest.warns(UserWarning, match="learning afresh"):
        planner.load_acceptance(path, {"model": "m"})
    assert planner.acceptance.state() == {"buckets": [], "scales": []}


def test_a_trie_of_another_vocabulary_is_refused(tmp_path) -> None:
    path = trie_file(tmp_path, nodes=[[VOCAB + 3, -1, {"a": 1}]])
    with pytest.raises(ValueError, match="outside a 96-token vocabulary"):
        TokenTrie.load(path, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="built for another tokenizer"):
        LookaheadEngine(tiny_model("llama"), CharTokenizer(), trie=TokenTrie.load(path))


def test_one_string_is_one_document_and_one_stop_string(engine) -> None:
    reference = greedy_reference(engine.model, PROMPT, 2 * N)
    text = CharTokenizer().decode(reference)
    streamed = engine.stream(PROMPT, max_new_tokens=2 * N, documents=text)
    next(streamed)
    (owner,) = engine.trie.owners() - {OUTPUT_OWNER}
    assert engine.trie.counts_at(reference[:3]).get(owner) == 1  # the text, not its characters
    streamed.close()
    stop = text[5:7]
    stopped = engine.complete(PROMPT, max_new_tokens=2 * N, stop_strings=stop)
    assert stopped.stats.finish_reason == "stop_string" and stopped.text == text[: text.index(stop)]


def test_finish_reason_is_none_until_the_stream_ends(engine) -> None:
    stream = engine.stream(PROMPT, max_new_tokens=N)
    assert stream.stats.finish_reason is None
    next(stream)
    assert stream.stats.finish_reason is None
    stream.close()
    assert stream.stats.finish_reason == "abandoned"
    unstarted = engine.stream(PROMPT, max_new_tokens=N)
    unstarted.close()
    assert unstarted.stats.finish_reason == "abandoned"


# ---------------------------------------------------------------------------- nested tool schemas

_ADDRESS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 5}},
    "required": ["city"],
    "additionalProperties": False,
}


def _defs(properties: dict[str, Any], key: str = "$defs") -> dict[str, Any]:
    """Tool parameters as pydantic writes a model nesting ``Address``: defined once, referred to."""
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        key: {"Address": _ADDRESS},
    }


_REF = {"$ref": "#/$defs/Address"}

# (case, a tool's parameters, arguments that keep to them, arguments that do not): each forces
# a call in every tool format, by name and among other tools.
NESTED_TOOL_SCHEMA_CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("a nested model", _defs({"home": _REF}), {"home": {"city": "Caen"}}, {"home": {"town": "Caen"}}),
    (
        "a list of nested models",
        _defs({"homes": {"type": "array", "items": _REF}}),
        {"homes": [{"city": "Caen"}, {"city": "Bayeu"}]},
        {"homes": [{"city": "Rouen!"}]},
    ),
    (
        "an Optional nested model",
        _defs({"home": {"anyOf": [_REF, {"type": "null"}]}}),
        {"home": None},
        {"home": {}},
    ),
    (
        "draft-07 definitions",
        _defs({"home": {"$ref": "#/definitions/Address"}}, "definitions"),
        {"home": {"city": "Caen"}},
        {"home": {"city": 14}},
    ),
    (
        "a ref to the root",
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "parts": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["name"],
        },
        {"name": "a", "parts": [{"name": "b", "parts": []}]},
        {"name": "a", "parts": [{"parts": []}]},
    ),
    (
        "a ref into the root's properties",
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}}},
        {"a": 1, "b": 2},
        {"a": 1, "b": "2"},
    ),
]


def _call_text(fmt: ToolFormat, name: str, arguments: dict[str, Any]) -> str:
    call = json.dumps({"name": name, fmt.arguments_key: arguments})
    return {
        "smollm2": f"<tool_call>[\n{call}\n]</tool_call>",
        "hermes": f"<tool_call>\n{call}\n</tool_call>",
    }.get(fmt.name, call)


@pytest.mark.parametrize(
    ("case", "parameters", "good", "bad"),
    NESTED_TOOL_SCHEMA_CASES,
    ids=[c[0] for c in NESTED_TOOL_SCHEMA_CASES],
)
@pytest.mark.parametrize("format_name", ["smollm2", "hermes", "llama3"])
def test_a_tool_of_nested_schemas_forces_a_call_in_every_format(
    format_name: ToolFormatName,
    case: str,
    parameters: dict[str, Any],
    good: dict[str, Any],
    bad: dict[str, Any],
) -> None:
    fmt = ToolFormat.named(format_name)
    tools = [{"name": "other", "parameters": _defs({"x": _REF})}, {"name": "f", "parameters": parameters}]
    for choice in ("f", None):
        grammar = fmt.grammar(tools, choice)
        assert grammar_accepts(grammar, _call_text(fmt, "f", good)), choice
        assert not grammar_accepts(grammar, _call_text(fmt, "f", bad)), choice


# (case, a tool's parameters, error, words of its message)
TOOL_SCHEMA_CASES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("$defs as a list", {"type": "object", "$defs": [_ADDRESS]}, TypeError, "'$defs' is a mapping of"),
    ("definitions as text", {"type": "object", "definitions": "Address"}, TypeError, "'definitions' is a"),
]


@pytest.mark.parametrize(
    ("case", "parameters", "error", "words"), TOOL_SCHEMA_CASES, ids=[c[0] for c in TOOL_SCHEMA_CASES]
)
def test_a_hostile_tool_schema_is_refused(case, parameters, error, words) -> None:
    tool = {"name": "f", "parameters": parameters}
    with pytest.raises(error) as raised:
        ToolFormat.named("hermes").grammar([tool], "f")
    assert words in str(raised.value) and "tool 'f'" in str(raised.value), str(raised.value)
