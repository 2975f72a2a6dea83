"""Grammars that close in budget: a structured answer or a forced call ends complete within
``max_new_tokens`` whenever its shortest completion fits, and lookahead still gives, token for
token, what constrained plain decoding gives under the same grammar and budget."""

from __future__ import annotations

import json
import random
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.constraint import GrammarCompiler
from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.models import default_model_dir
from rag_lookahead.protocol.requests import plan_completion
from rag_lookahead.structured import Grammar, ToolFormat
from rag_lookahead.testing import (
    ASCII_VOCAB,
    SMALL_SCHEMA,
    VOCAB,
    ascii_fast_tokenizer,
    grammar_accepts,
    nested_person,
    packaged_template,
    small_grammars,
    tiny_model,
    tiny_tool_engine,
)

PROMPT = [40, 41, 42, 0, 33, 34]
JOKE = {
    "type": "object",
    "properties": {"setup": {"type": "string"}, "punchline": {"type": "string"}},
    "required": ["setup", "punchline"],
}
BOUNDS = {  # values whose shortest form is not the first one tried
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": "^[xyz]{2,4}$"},
        "n": {"type": "integer", "minimum": 5},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 1},
    },
    "required": ["code", "n", "ok", "tags"],
}
RANGE = {  # only "0.6" closes it: "0.5", "0.50", "0.500"... never do
    "type": "object",
    "properties": {"f": {"type": "number", "exclusiveMinimum": 0.5, "maximum": 0.6}},
    "required": ["f"],
}
FORTY = [f"k{i}" for i in range(40)]
INTEGERS = {"type": "object", "properties": {k: {"type": "integer"} for k in FORTY}, "required": FORTY}
GRAMMARS = {
    name: grammar.closing_in_budget()
    for name, grammar in {
        **small_grammars(),
        "joke": Grammar.json_schema(JOKE),
        "bounds": Grammar.json_schema(BOUNDS),
        "nested": Grammar.json_schema(nested_person().model_json_schema()),
        "any object": Grammar.json(),
        "range": Grammar.json_schema(RANGE),
    }.items()
}


def engine_for(family: str, **config: Any) -> LookaheadEngine:
    config = {"min_query_length": 1, **config}
    return LookaheadEngine(tiny_model(family), ascii_fast_tokenizer(), LookaheadConfig(**config))


def json_part(name: str, text: str) -> Any:
    return json.loads(text.removeprefix("<call>").removesuffix("</call>") if name == "tool call" else text)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma"])
@settings(max_examples=16, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.sampled_from(sorted(GRAMMARS)),
    budget=st.integers(1, 64),
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(["trie", "jacobi"]),
    decoding_length=st.integers(3, 16),
    sampled=st.booleans(),
)
def test_lookahead_in_a_small_budget_equals_plain_and_ends_complete_where_it_can(
    family: str, name: str, budget: int, seed: int, mode: str, decoding_length: int, sampled: bool
) -> None:
    grammar = GRAMMARS[name]
    params = GenerationParams(max_new_tokens=budget, grammar=grammar, do_sample=sampled, seed=seed)
    plain = engine_for(family, mode="off").complete(PROMPT, params)
    engine = engine_for(family, mode=mode, decoding_length=decoding_length)
    rng = random.Random(seed)
    for _ in range(rng.randint(0, 3)):  # the answer with mistakes: tokens the grammar refuses too
        start = rng.randrange(len(plain.token_ids) + 1)
        piece = plain.token_ids[start : start + 12]
        piece = [rng.randrange(VOCAB) if rng.random() < 0.2 else t for t in piece]
        engine.trie.insert(PROMPT[-2:] + plain.token_ids[:start] + piece, OUTPUT_OWNER)
    drafted = engine.complete(PROMPT, params)
    assert drafted.token_ids == plain.token_ids
    if budget >= engine.budget_to_close(grammar):
        assert drafted.stats.finish_reason == "eos", drafted.text
        assert grammar_accepts(grammar, drafted.text), drafted.text
        if name != "regex":
            json_part(name, drafted.text)


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_a_budget_below_the_one_to_close_decodes_as_without_closing_or_ends_complete(name: str) -> None:
    # Below it, the text keeps to the model's tokens until a completion of the text so far
    # fits in the tokens left (the model's own values may be shorter than the forced ones).
    engine = engine_for("qwen2", mode="off")
    grammar = GRAMMARS[name]
    floor = engine.budget_to_close(grammar)
    for budget in (max(floor - 3, 1), floor - 1):
        closing = engine.complete(PROMPT, max_new_tokens=budget, grammar=grammar)
        as_given = Grammar(grammar.kind, grammar.value, grammar.parts)
        before = engine.complete(PROMPT, max_new_tokens=budget, grammar=as_given)
        if closing.token_ids != before.token_ids:
            assert closing.stats.finish_reason == "eos" and grammar_accepts(grammar, closing.text)


def test_an_answer_cut_without_closing_ends_complete_with_it() -> None:
    engine = engine_for("qwen2", mode="trie")
    plain = Grammar.json_schema(SMALL_SCHEMA)
    cut = engine.complete(PROMPT, max_new_tokens=32, grammar=plain)
    assert cut.stats.finish_reason == "length"  # the tiny model's integer runs on
    closed = engine.complete(PROMPT, max_new_tokens=32, grammar=plain.closing_in_budget())
    assert closed.stats.finish_reason == "eos"
    assert set(json.loads(closed.text)) == {"a", "b", "c"}
    assert engine.budget_to_close(plain) == len('{"a": "", "b": "xy", "c": 0}') + 1  # and <eos>


def test_forced_calls_and_response_formats_close_in_budget() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for fmt in ("smollm2", "hermes", "llama3"):
        assert ToolFormat.named(fmt).grammar([tool]).closes_in_budget  # type: ignore[arg-type]
    assert not Grammar.json_schema(SMALL_SCHEMA).closes_in_budget  # a grammar of one's own: as given
    with pytest.raises(TypeError, match="closes_in_budget"):
        Grammar("json", closes_in_budget="yes")  # type: ignore[arg-type]
    for response_format in (
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"schema": SMALL_SCHEMA}},
    ):
        plan = plan_completion({"prompt": "hi", "response_format": response_format})
        assert plan.params.grammar is not None and plan.params.grammar.closes_in_budget


@pytest.mark.parametrize("budget", [74, 90])  # one byte a token: 73 of them at least
def test_a_forced_call_of_the_tiny_model_parses_in_a_small_budget(budget: int) -> None:
    engine = tiny_tool_engine(packaged_template())
    fmt = ToolFormat.named("smollm2")
    search = {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
    grammar = fmt.grammar([search])
    assert engine.budget_to_close(grammar) <= budget
    messages = [{"role": "user", "content": "Find the keys."}]
    completion = engine.complete(messages, tools=[search], grammar=grammar, max_new_tokens=budget)
    reply = fmt.parse(completion.text)
    assert completion.stats.finish_reason == "eos" and reply.invalid == ()
    assert [c.name for c in reply.calls] == ["search"] and isinstance(reply.calls[0].arguments["query"], str)


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_a_completion_after_its_own_first_token_is_the_rest_of_it(name: str) -> None:
    # What keeps a call that takes the completion's tokens in its budget, and what lets the
    # engine keep the completion instead of seeking it again after each of them.
    compiler = GrammarCompiler(ascii_fast_tokenizer(), ASCII_VOCAB + 1)
    state = compiler.state(GRAMMARS[name], [ASCII_VOCAB])
    matcher, rng = state._matcher, random.Random(name)
    assert state.closing(64) is not None  # an empty answer completes
    for _ in range(24):  # along a random answer the grammar allows
        completion = state.closing(64)
        if completion is not None and len(completion) > 1:
            matcher.consume_token(completion[0])
            assert state.closing(63) == completion[1:]
            matcher.rollback(1)
        allowed = state.allowed(DraftTree.root_only(0))[0]  # [V]
        allowed[ASCII_VOCAB] = False
        if not allowed.any():
            break
        matcher.consume_token(rng.choice(allowed.nonzero()[:, 0].tolist()))


@cache
def _smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir(), local_files_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("past", [0, 20])
def test_an_answer_past_256_tokens_ends_complete_from_its_budget_to_close(past: int) -> None:
    # The default tokenizer spells forty required integers in about 300 tokens: closing once
    # began looking 256 tokens before the end, by when the model's own values left no room.
    tokenizer = _smollm2_tokenizer()
    model = tiny_model("llama", 0, len(tokenizer))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    grammar = Grammar.json_schema(INTEGERS).closing_in_budget()
    plain = LookaheadEngine(model, tokenizer, LookaheadConfig(mode="off"))
    budget = plain.budget_to_close(grammar) + past
    assert budget > 256 + past
    prompt = tokenizer.encode("The forty numbers:")
    expected = plain.complete(prompt, max_new_tokens=budget, grammar=grammar)
    assert expected.stats.finish_reason == "eos", expected.text[-80:]
    assert list(json.loads(expected.text)) == FORTY
    engine = LookaheadEngine(model, tokenizer, LookaheadConfig(mode="trie", min_query_length=1))
    assert engine.complete(prompt, max_new_tokens=budget, grammar=grammar).token_ids == expected.token_ids
