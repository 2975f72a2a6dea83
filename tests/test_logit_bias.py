"""``logit_bias`` is honoured exactly: added to the logits at every node the verifier scores,
greedy or sampling, so a biased call with lookahead emits what plain decoding emits with the
same bias (`model.generate`'s ``sequence_bias`` of single tokens is the reference)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.decoding.verify import TokenChooser
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.testing import CharTokenizer, greedy_reference, run_together, tiny_model

PROMPT = [3, 14, 15, 9, 26]
N = 16


def drafting_engine(model: object) -> LookaheadEngine:
    return LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))


def biased_reference(model: object, bias: dict[int, float]) -> list[int]:
    """Plain `model.generate` greedy with ``bias`` added to the logits at every step."""
    return greedy_reference(model, PROMPT, N, sequence_bias={(t,): b for t, b in bias.items()})


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_greedy_with_a_bias_is_plain_generate_with_it_while_drafts_are_accepted(family: str) -> None:
    model = tiny_model(family)
    plain = greedy_reference(model, PROMPT, N)
    bias = {plain[0]: -100.0, 7: 3.5, 40: -2.0}  # bans the plain answer's first token
    expected = biased_reference(model, bias)
    assert expected != plain  # the bias changes the answer
    engine = drafting_engine(model)
    engine.trie.insert(PROMPT[-2:] + expected, OUTPUT_OWNER)  # the biased answer, to draft
    engine.trie.insert(PROMPT[-2:] + plain, OUTPUT_OWNER)  # and the unbiased one, to reject
    out = engine.complete(PROMPT, max_new_tokens=N, logit_bias=bias)
    assert out.token_ids == expected
    assert sum(out.stats.accepted_per_step) > 0  # drafts were verified under the bias, and kept
    assert engine.complete(PROMPT, max_new_tokens=N).token_ids == plain  # the bias was the call's


def test_biased_and_unbiased_calls_share_a_batch_each_with_its_own_answer() -> None:
    model = tiny_model("llama")
    plain = greedy_reference(model, PROMPT, N)
    bias = {plain[1]: -100.0, 5: 2.0}
    engine = drafting_engine(model)
    engine.trie.insert(PROMPT[-2:] + plain, OUTPUT_OWNER)
    jobs = [
        (PROMPT, GenerationParams(max_new_tokens=N, logit_bias=bias)),
        (PROMPT, GenerationParams(max_new_tokens=N)),
    ]
    biased, unbiased = run_together(engine, jobs, stagger=1)
    assert biased.token_ids == biased_reference(model, bias)
    assert unbiased.token_ids == plain


def test_a_seeded_biased_call_samples_what_plain_decoding_samples() -> None:
    model = tiny_model("llama")
    prompt = [5, 9, 2, 5, 9, 2, 5]
    bias = {9: 4.0, 2: -100.0, 60: 1.5}
    params = GenerationParams(max_new_tokens=24, do_sample=True, temperature=1.2, top_p=0.95, seed=11)
    biased = params.with_overrides(logit_bias=bias)
    plain = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="off")).complete(prompt, biased)
    engine = drafting_engine(model)
    engine.trie.insert([9, 2, *plain.token_ids], OUTPUT_OWNER)  # its answer, to draft and accept
    engine.trie.insert([9, 2, 5, 2, 2, 2], OUTPUT_OWNER)  # and a banned token, to draft and reject
    out = engine.complete(prompt, biased)
    assert out.token_ids == plain.token_ids
    assert sum(out.stats.accepted_per_step) > 0
    assert 2 not in out.token_ids  # -100 bans it in effect
    assert engine.complete(prompt, params).token_ids != out.token_ids


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.001 quantile of chi-square (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_a_sampled_token_follows_the_biased_distribution() -> None:
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, 2.0, 0.2]])  # [1, V]
    bias = {0: 1.5, 4: -3.0, 5: -100.0}
    params = GenerationParams(do_sample=True, temperature=0.8, logit_bias=bias)
    shifted = logits[0] + torch.tensor([bias.get(t, 0.0) for t in range(logits.shape[1])])
    expected = torch.softmax(shifted / 0.8, dim=-1).tolist()
    samples = 4000
    root = DraftTree.root_only(1)
    counts = Counter(
        TokenChooser(params.with_overrides(seed=seed)).choose(logits, [1, 2, 3], root)[0]
        for seed in range(samples)
    )
    assert counts[5] == 0  # a bias of -100 leaves it no share a draw can reach
    cells = [t for t in range(len(expected)) if expected[t] * samples >= 5]
    stat = sum((counts[t] - expected[t] * samples) ** 2 / (expected[t] * samples) for t in cells)
    assert stat < chi2_critical(len(cells) - 1), (stat, counts, expected)


def test_the_bias_comes_before_the_grammar_can_be_outweighed() -> None:
    """A grammar's refusal is -inf, which no bias lifts; among the allowed tokens, the bias
    decides as it would without a grammar."""
    logits = torch.tensor([[0.0, 3.0, 1.0, 0.5]])  # [1, V]
    allowed = torch.tensor([[True, False, True, True]])  # token 1 refused
    root = DraftTree.root_only(0)
    boosted = TokenChooser(GenerationParams(logit_bias={1: 100, 3: 0.6}))
    assert boosted.choose(logits, [0], root, allowed) == [3]
    assert TokenChooser(GenerationParams()).choose(logits, [0], root, allowed) == [2]


def test_the_bias_is_kept_as_pairs_in_id_order_and_checked() -> None:
    assert GenerationParams(logit_bias={9: 1, 2: -100}).logit_bias == ((2, -100.0), (9, 1.0))
    assert GenerationParams(logit_bias=[(4, 0.5)]) == GenerationParams(logit_bias={4: 0.5})
    assert GenerationParams(logit_bias={}).logit_bias == ()
    for bad, words in [
        ({1: 100.5}, "from -100 to 100"),
        ({1: float("inf")}, "from -100 to 100"),
        ({1: True}, "from -100 to 100"),
        ({1: "2"}, "from -100 to 100"),
        ({-1: 1}, "non-negative token ids"),
        ({"1": 1}, "non-negative token ids"),
        ([(1, 1), (1, 2)], "twice"),
        ([1, 2], "map token ids to biases"),
        ("1", "map token ids to biases"),
    ]:
        with pytest.raises(ValueError, match=words):
            GenerationParams(logit_bias=bad)  # type: ignore[arg-type]
