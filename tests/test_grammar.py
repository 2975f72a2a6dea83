"""Constrained decoding: lookahead under a grammar == constrained plain decoding, token for token.

The references are `model.generate` with a logits processor that applies the grammar's mask
(independent of the engine's tree code), and the engine with lookahead off. Drafts are noisy
copies of the reference answer, refused tokens and the grammar's own forced tokens.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessor, LogitsProcessorList

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.constraint import GrammarCompiler, to_lark
from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.planning.costs import CostCurve
from rag_lookahead.structured import Grammar
from rag_lookahead.testing import (
    ASCII_VOCAB,
    FAMILIES,
    VOCAB,
    ascii_fast_tokenizer,
    run_together,
    small_grammars,
    tiny_model,
)

EOS = ASCII_VOCAB  # the fast ASCII tokenizer's <eos>
PROMPT = [40, 41, 42, 0, 33, 34]
GRAMMARS = small_grammars()
N = 32

_TOKENIZER = ascii_fast_tokenizer()


def tokenizer() -> Any:
    return _TOKENIZER


class GrammarProcessor(LogitsProcessor):
    """The grammar's mask in `model.generate`: the reference for constrained plain decoding."""

    def __init__(self, grammar: Grammar, prompt_length: int) -> None:
        view = llguidance.hf.from_tokenizer(tokenizer(), n_vocab=VOCAB, eos_token=[EOS])
        self.matcher = llguidance.LLMatcher(view, to_lark(grammar))
        self.prompt_length = prompt_length
        self.bits = llguidance.torch.allocate_token_bitmask(1, VOCAB)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > self.prompt_length:
            assert self.matcher.consume_token(int(input_ids[0, -1]))
        llguidance.torch.fill_next_token_bitmask(self.matcher, self.bits, 0)
        allowed = ((self.bits[0].unsqueeze(-1) >> torch.arange(32)) & 1).bool().reshape(-1)[:VOCAB]
        return scores.masked_fill(~allowed, float("-inf"))


def constrained_reference(model: Any, grammar: Grammar, prompt: list[int], n: int = N) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=EOS,
            logits_processor=LogitsProcessorList([GrammarProcessor(grammar, len(prompt))]),
        )
    return out[0, len(prompt) :].tolist()


def engine_for(model: Any, **config: Any) -> LookaheadEngine:
    return LookaheadEngine(model, tokenizer(), LookaheadConfig(min_query_length=1, **config))


def test_constrained_plain_decoding_equals_generate_with_the_grammar_mask() -> None:
    model = tiny_model("llama")
    for name, grammar in GRAMMARS.items():
        expected = constrained_reference(model, grammar, PROMPT)
        got = engine_for(model, mode="off").complete(PROMPT, max_new_tokens=N, grammar=grammar)
        assert got.token_ids == expected, name


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    grammar=st.sampled_from(sorted(GRAMMARS)),
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(["trie", "auto", "jacobi"]),
    decoding_length=st.integers(3, 20),
    curve=st.sampled_from([CostCurve.flat(), CostCurve((1, 2, 8, 16), (1.0, 1.6, 1.7, 2.0))]),
)
def test_lookahead_under_a_grammar_equals_constrained_plain_decoding(
    family: str, grammar: str, seed: int, mode: str, decoding_length: int, curve: CostCurve
) -> None:
    model = tiny_model(family)
    reference = constrained_reference(model, GRAMMARS[grammar], PROMPT)
    engine = LookaheadEngine(
        model,
        tokenizer(),
        LookaheadConfig(mode=mode, decoding_length=decoding_length, min_query_length=1),  # type: ignore[arg-type]
        cost_curve=curve,
    )
    rng = random.Random(seed)
    for _ in range(rng.randint(0, 4)):  # the answer with mistakes: tokens the grammar refuses too
        start = rng.randrange(len(reference))
        piece = [rng.randrange(VOCAB) if rng.random() < 0.2 else t for t in reference[start : start + 12]]
        engine.trie.insert(PROMPT[-2:] + reference[:start] + piece, OUTPUT_OWNER)
    completion = engine.complete(PROMPT, max_new_tokens=N, grammar=GRAMMARS[grammar])
    assert completion.token_ids == reference
    assert engine.trie.count_owned(OUTPUT_OWNER) == len(engine.trie)


def test_forced_tokens_are_drafted_and_accepted() -> None:
    model = tiny_model("llama")
    engine = engine_for(model, mode="trie")
    grammar = GRAMMARS["schema"]
    completion = engine.complete(PROMPT, max_new_tokens=64, grammar=grammar)
    assert completion.token_ids == constrained_reference(model, grammar, PROMPT, 64)
    stats = completion.stats
    grammar_steps = [
        a for a, s in zip(stats.accepted_per_step, stats.draft_sources, strict=True) if "grammar" in s
    ]
    assert grammar_steps and sum(grammar_steps) >= len('"a": "') + len('", "b": "')  # keys, separators
    text = completion.text
    if stats.finish_reason == "eos":
        value = json.loads(text)
        assert set(value) == {"a", "b", "c"} and value["b"] in ("xy", "zw")


def test_an_answer_that_ends_keeps_to_the_grammar() -> None:
    engine = engine_for(tiny_model("qwen2"), mode="trie")
    pattern = r"[a-f]{2,6}( [a-f]{2,6}){0,3}\."
    completion = engine.complete(PROMPT, max_new_tokens=64, grammar=Grammar.regex(pattern))
    assert completion.stats.finish_reason == "eos"  # the grammar's language is finite
    assert re.fullmatch(pattern, completion.text)


def test_sampling_under_a_grammar_repeats_with_a_seed_and_keeps_to_it() -> None:
    model = tiny_model("mistral")
    params = GenerationParams(
        max_new_tokens=N, do_sample=True, temperature=1.5, seed=3, grammar=GRAMMARS["regex"]
    )
    plain = engine_for(model, mode="off").complete(PROMPT, params)
    engine = engine_for(model, mode="trie")
    engine.trie.insert(PROMPT[-2:] + plain.token_ids, OUTPUT_OWNER)
    drafted = engine.complete(PROMPT, params)
    assert drafted.token_ids == plain.token_ids
    assert sum(drafted.stats.accepted_per_step) > 0
    for seed in range(12):  # every sampled answer is in the grammar's (finite) language
        sampled = engine.complete(PROMPT, params.with_overrides(seed=seed))
        assert sampled.stats.finish_reason == "eos"
        assert re.fullmatch(r"[a-f]{2,6}( [a-f]{2,6}){0,3}\.", sampled.text), sampled.text


def test_batched_calls_with_and_without_grammars_answer_as_alone() -> None:
    model = tiny_model("llama")
    engine = engine_for(model, mode="trie", max_batch_size=4)
    prompts = [PROMPT, [7, 8, 9, 10], PROMPT[::-1], [20, 21, 22]]
    grammars = [GRAMMARS["schema"], None, GRAMMARS["regex"], GRAMMARS["tool call"]]
    jobs = [
        (p, GenerationParams(max_new_tokens=N, grammar=g)) for p, g in zip(prompts, grammars, strict=True)
    ]
    alone = [engine_for(model, mode="off").complete(p, params) for p, params in jobs]
    together = run_together(engine, jobs, stagger=2)
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]


def test_tree_masks_equal_each_nodes_own_prefix() -> None:
    compiler = GrammarCompiler(tokenizer(), VOCAB)
    grammar = GRAMMARS["schema"]
    encode = tokenizer().encode
    # Root '{' already emitted; branches: a valid key, a refused token, a deeper valid path.
    paths = ['"a": "q', '"b"', "x", '"a": 7']
    tree = DraftTree.root_only(encode("{")[0])
    for path in paths:
        ids = encode(path)
        tree = tree.merge(DraftTree(tuple(encode("{") + ids), tuple(range(-1, len(ids)))))
    state = compiler.state(grammar, [EOS])
    state.advance(encode("{"))
    admitted = state.admitted(tree)
    assert len(admitted) < len(tree)  # 'x' and what follows '"a": ' with a digit are gone
    masks = state.allowed(admitted)
    for node in range(len(admitted)):
        fresh = compiler.state(grammar, [EOS])
        fresh.advance(encode("{") + [admitted.tokens[i] for i in admitted.path(node)[1:]])
        assert torch.equal(masks[node], fresh.allowed(DraftTree.root_only(0))[0]), node
    assert torch.equal(state.allowed(DraftTree.root_only(0)), masks[:1])  # rolled back to the root


def test_lark_translation_of_each_kind() -> None:
    lark = to_lark(GRAMMARS["tool call"])
    assert lark.startswith('start: r0\nr0: r1 r2 r5\nr1: "<call>"\nr2: r3 | r4\nr3: %json {')
    assert '"x-guidance": {"whitespace_flexible": false' in lark
    own = Grammar.json_schema({"type": "object", "x-guidance": {"whitespace_flexible": True}})
    assert '"whitespace_flexible": true' in to_lark(own)  # a schema's own layout wins
    assert to_lark(Grammar.regex("a/b")) == "start: r0\nr0: /a\\/b/\n"


def test_a_pydantic_model_is_its_json_schema() -> None:
    pydantic = pytest.importorskip("pydantic")  # not a core dependency

    class Joke(pydantic.BaseModel):
        setup: str
        punchline: str = pydantic.Field(max_length=40)

    assert Grammar.json_schema(Joke) == Grammar.json_schema(Joke.model_json_schema())


# (case, how the grammar is made or passed, error, words of its message)
HOSTILE: list[tuple[str, Any, type[Exception], str]] = [
    ("schema not JSON", lambda: Grammar.json_schema("{type: object"), ValueError, "not valid JSON"),
    ("schema a list", lambda: Grammar.json_schema("[1, 2]"), ValueError, "JSON object"),
    ("schema an int", lambda: Grammar.json_schema(3), TypeError, "mapping"),  # type: ignore[arg-type]
    ("schema a plain class", lambda: Grammar.json_schema(dict), TypeError, "pydantic model"),
    ("schema with NaN", lambda: Grammar.json_schema({"const": float("nan")}), ValueError, "JSON"),
    ("bad regex", lambda: Grammar.regex("(a"), ValueError, "does not compile"),
    ("empty regex", lambda: Grammar.regex(""), ValueError, "non-empty"),
    ("empty literal", lambda: Grammar.literal(""), ValueError, "non-empty"),
    ("empty sequence", lambda: Grammar.sequence(), ValueError, "one or more"),
    ("choice of strings", lambda: Grammar.choice("a"), ValueError, "Grammar parts"),  # type: ignore[arg-type]
    ("unknown kind", lambda: Grammar("yaml", "x"), ValueError, "kind must be"),  # type: ignore[arg-type]
    ("grammar as a dict", lambda: GenerationParams(grammar={"type": "object"}), TypeError, "Grammar"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("case", "make", "error", "words"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_a_hostile_grammar_is_refused(case, make, error, words) -> None:
    with pytest.raises(error) as raised:
        make()
    assert words in str(raised.value), str(raised.value)


def test_a_grammar_the_library_refuses_fails_the_call_and_loses_nothing() -> None:
    model = tiny_model("llama")
    engine = engine_for(model, mode="trie")
    unsupported = Grammar.json_schema(
        {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}
    )
    with pytest.raises(ValueError, match="grammar cannot be used"):
        engine.complete(PROMPT, max_new_tokens=N, grammar=unsupported)
    assert engine.trie.owners() <= {OUTPUT_OWNER}
    answer = engine.complete(PROMPT, max_new_tokens=8, grammar=GRAMMARS["regex"])
    assert answer.token_ids == constrained_reference(model, GRAMMARS["regex"], PROMPT, 8)
