"""Sampling through draft trees draws from the model's own processed distribution."""

import itertools
import math
from collections import Counter

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.testing import CharTokenizer, greedy_reference, tiny_model

VOCAB = 5
PROMPT = [1, 2, 3]
SAMPLES = 2000
PARAMS = GenerationParams(
    max_new_tokens=5, do_sample=True, temperature=0.7, top_k=4, top_p=0.9, repetition_penalty=1.3
)


def exact_distribution(model) -> dict[tuple[int, ...], float]:
    """P(t1, t2, t3) from plain forwards of every prefix, processed like `generate` does."""
    processors = LogitsProcessorList(
        [
            RepetitionPenaltyLogitsProcessor(1.3),
            TemperatureLogitsWarper(0.7),
            TopKLogitsWarper(4),
            TopPLogitsWarper(0.9),
        ]
    )

    def next_probs(prefix: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([prefix])).logits[:, -1].float()
        return torch.softmax(processors(torch.tensor([prefix]), logits), -1)[0]

    dist = {}
    for triple in itertools.product(range(VOCAB), repeat=3):
        p = 1.0
        for i, token in enumerate(triple):
            p *= next_probs(PROMPT + list(triple[:i]))[token].item()
            if p == 0:
                break
        dist[triple] = p
    return dist


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.001 quantile of chi-square (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampled_triples_follow_the_model_distribution() -> None:
    model = tiny_model("llama", seed=1, vocab=VOCAB)
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    for triple in itertools.product(range(VOCAB), repeat=3):  # draft every continuation,
        for _ in range(1 + sum(triple) % 3):  # with uneven counts for deep and wide trees
            engine.trie.insert(PROMPT[-2:] + list(triple), OUTPUT_OWNER)
    counts: Counter = Counter()
    drafted = accepted = 0
    for seed in range(SAMPLES):
        completion = engine.complete(PROMPT, PARAMS.with_overrides(seed=seed))
        counts[tuple(completion.token_ids[:3])] += 1  # later tokens leave this marginal alone
        drafted += sum(completion.stats.drafted_per_step)
        accepted += sum(completion.stats.accepted_per_step)
    assert accepted > SAMPLES // 4 and drafted > accepted  # the tree did the work

    expected = exact_distribution(model)
    assert all(expected[k] > 0 for k in counts), "sampled a token the processors forbid"
    # Pool the rare cells so every cell expects at least 5 draws.
    stat, df, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for key, p in sorted(expected.items(), key=lambda kv: kv[1]):
        pooled_obs += counts[key]
        pooled_exp += p * SAMPLES
        if pooled_exp >= 5:
            stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
            df += 1
            pooled_obs, pooled_exp = 0, 0.0
    assert df >= 5
    assert stat < chi2_critical(df), (stat, df)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_a_seeded_call_samples_the_same_tokens_whatever_the_trie_holds(family: str) -> None:
    model = tiny_model(family)
    params = GenerationParams(max_new_tokens=24, do_sample=True, temperature=1.3, top_p=0.95, seed=7)
    prompt = [5, 9, 2, 5, 9, 2, 5]
    plain = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="off")).complete(prompt, params)
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    first = engine.complete(prompt, params)  # its output now sits in the trie: the second drafts it
    engine.trie.insert([9, 2, 5, 1, 1, 1, 1], OUTPUT_OWNER)  # and some junk to draft and reject
    second = engine.complete(prompt, params)
    assert first.token_ids == second.token_ids == plain.token_ids
    assert sum(second.stats.accepted_per_step) > 0  # the drafts were verified, and kept
    other = engine.complete(prompt, params.with_overrides(seed=8))
    assert other.token_ids != plain.token_ids


def test_temperature_zero_is_greedy_even_when_sampling_is_asked_for() -> None:
    model = tiny_model("llama")
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    params = GenerationParams(max_new_tokens=12, do_sample=True, temperature=0, top_p=0.5, seed=3)
    assert not params.sampling
    assert engine.complete(PROMPT, params).token_ids == greedy_reference(model, PROMPT, 12)
