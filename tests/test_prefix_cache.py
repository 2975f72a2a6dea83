"""Prompt prefixes reused across calls: the same outputs, fewer tokens prefilled."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.prefix import PrefixCache
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.testing import FAMILIES, CharTokenizer, greedy_reference, tiny_model
from rag_lookahead.tuning import ModelTuning


def prefilled(runner: ModelRunner, prompt: list[int]):
    cache = new_tree_cache()
    runner.forward(torch.tensor([prompt]), cache, last_only=True)
    return cache


def test_a_prompt_starts_from_the_longest_kept_prefix() -> None:
    runner = ModelTuning(tiny_model("llama")).runner
    prefixes = PrefixCache(1 << 30)
    prefixes.store([1, 2, 3, 4, 5], prefilled(runner, [1, 2, 3, 4, 5]))
    prefixes.store([1, 2, 9, 9], prefilled(runner, [1, 2, 9, 9]))
    cache, reused = prefixes.lookup([1, 2, 3, 4, 8, 8])
    assert reused == 4 and cache.get_seq_length() == 4
    reference = prefilled(runner, [1, 2, 3, 4])
    for layer, expected in zip(cache.layers, reference.layers, strict=True):
        torch.testing.assert_close(layer.keys, expected.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.values, expected.values, rtol=1e-5, atol=1e-5)
    # A repeated prompt keeps its last token to prefill: its forward gives the first logits.
    assert prefixes.lookup([1, 2, 3, 4, 5])[1] == 4
    assert prefixes.lookup([7, 1, 2])[1] == 0


def test_kept_prefixes_stay_within_the_cap() -> None:
    runner = ModelTuning(tiny_model("llama")).runner
    one = prefilled(runner, [1, 2, 3, 4])
    size = sum(2 * layer.keys.nbytes for layer in one.layers)
    prefixes = PrefixCache(2 * size)
    prefixes.store([1, 2, 3, 4], one)
    prefixes.store([5, 6, 7, 8], prefilled(runner, [5, 6, 7, 8]))
    prefixes.lookup([1, 2, 3, 9])  # the first one is now the more recently used
    prefixes.store([9, 9, 9, 9], prefilled(runner, [9, 9, 9, 9]))
    assert len(prefixes) == 2 and prefixes.bytes <= 2 * size
    assert prefixes.lookup([5, 6, 7, 0])[1] == 0  # the least recently used went out
    assert prefixes.lookup([1, 2, 3, 0])[1] == 3
    # A prompt covering a kept one replaces it (and needs the other's room here); one that a
    # kept one covers adds nothing.
    prefixes.store([1, 2, 3, 4, 5, 6], prefilled(runner, [1, 2, 3, 4, 5, 6]))
    assert len(prefixes) == 1 and prefixes.lookup([1, 2, 3, 4, 5, 6, 7])[1] == 6
    prefixes.store([1, 2], prefilled(runner, [1, 2]))
    assert len(prefixes) == 1 and prefixes.bytes == 6 * size // 4
    # Too large for the cap: not kept at all.
    tiny = PrefixCache(size // 2)
    tiny.store([1, 2, 3, 4], one)
    assert len(tiny) == 0 and tiny.bytes == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_reused_prefixes_give_the_same_outputs(family: str) -> None:
    model = tiny_model(family)
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    system = [(5 * i) % 90 + 3 for i in range(20)]
    prompts = [[*system, 1, 2, 3], [*system, 1, 2, 3], [*system, 7, 7], system[:9]]
    cached = []
    for prompt in prompts:
        completion = engine.complete(prompt, max_new_tokens=12)
        assert completion.token_ids == greedy_reference(model, prompt, 12)
        cached.append(completion.stats.cached_prompt_tokens)
    assert cached == [0, 22, 20, 8]


def test_prefix_reuse_can_be_turned_off() -> None:
    engine = LookaheadEngine(tiny_model("llama"), CharTokenizer(), LookaheadConfig(prefix_cache_mb=0))
    for _ in range(2):
        assert engine.complete([4, 5, 6, 7, 8], max_new_tokens=3).stats.cached_prompt_tokens == 0


def test_prompts_sharing_a_beginning_keep_its_entries_once() -> None:
    runner = ModelTuning(tiny_model("llama")).runner
    one = prefilled(runner, [1, 2, 3, 4])
    per_token = sum(2 * layer.keys.nbytes for layer in one.layers) // 4
    prefixes = PrefixCache(1 << 30)
    prefixes.store([1, 2, 3, 4], one)
    prefixes.store([1, 2, 7, 7, 7], prefilled(runner, [1, 2, 7, 7, 7]))  # splits the edge after 1, 2
    prefixes.store([1, 2, 3, 4, 5], prefilled(runner, [1, 2, 3, 4, 5]))
    assert len(prefixes) == 2 and prefixes.bytes == 8 * per_token  # 1 2 | 3 4 5 | 7 7 7
    for prompt, reused in (
        ([1, 2, 7, 7, 7, 0], 5),
        ([1, 2, 3, 4, 5, 0], 5),
        ([1, 2, 3, 9], 3),
        ([1, 2, 7, 0], 3),
    ):
        cache, got = prefixes.lookup(prompt)
        assert got == reused and cache.get_seq_length() == reused
        reference = prefilled(runner, prompt[:reused])
        for layer, expected in zip(cache.layers, reference.layers, strict=True):
            torch.testing.assert_close(layer.keys, expected.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(layer.values, expected.values, rtol=1e-5, atol=1e-5)


def test_the_least_recently_used_branch_goes_and_the_shared_trunk_stays() -> None:
    runner = ModelTuning(tiny_model("llama")).runner
    one = prefilled(runner, [1, 2, 3, 4])
    per_token = sum(2 * layer.keys.nbytes for layer in one.layers) // 4
    prefixes = PrefixCache(9 * per_token)
    prefixes.store([1, 2, 3, 4], one)  # trunk 1 2, then branch 3 4
    prefixes.store([1, 2, 5, 6], prefilled(runner, [1, 2, 5, 6]))
    prefixes.store([1, 2, 7, 8], prefilled(runner, [1, 2, 7, 8]))
    prefixes.lookup([1, 2, 3, 4, 0])  # 3 4 is now more recent than 5 6
    prefixes.store([9, 9, 9], prefilled(runner, [9, 9, 9]))  # needs one branch's room
    assert prefixes.bytes == 9 * per_token and len(prefixes) == 3
    assert prefixes.lookup([1, 2, 5, 6, 0])[1] == 2  # 5 6 went, the trunk stayed
    assert prefixes.lookup([1, 2, 3, 4, 0])[1] == 4
    # Nothing evicts the branch a new prompt extends, though 7 8 is now the oldest leaf.
    prefixes.store([1, 2, 7, 8, 1, 1, 1, 1], prefilled(runner, [1, 2, 7, 8, 1, 1, 1, 1]))
    assert prefixes.lookup([1, 2, 7, 8, 1, 1, 1, 1, 0])[1] == 8 and prefixes.bytes == 8 * per_token
    assert prefixes.lookup([1, 2, 3, 4, 0])[1] == 2 and prefixes.lookup([9, 9, 9, 0])[1] == 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), cap_tokens=st.sampled_from([6, 12, 40, 1000]))
def test_random_prompts_find_their_longest_kept_prefix_within_the_cap(seed: int, cap_tokens: int) -> None:
    """Against a plain record of the kept prompts: the longest shared prefix (with no cap),
    the bytes held, and a lookup's entries equal to a fresh prefill's (always)."""
    rng = random.Random(seed)
    runner = ModelTuning(tiny_model("llama")).runner
    per_token = sum(2 * layer.keys.nbytes for layer in prefilled(runner, [1]).layers)
    prefixes = PrefixCache(cap_tokens * per_token)
    kept: list[list[int]] = []
    for _ in range(8):
        prompt = [rng.choice([1, 2, 3]) for _ in range(rng.randint(1, 9))]
        cache, reused = prefixes.lookup(prompt)
        if cap_tokens == 1000:
            assert reused == min(len(prompt) - 1, max((_shared(p, prompt) for p in kept), default=0))
        assert cache.get_seq_length() == reused
        if reused:
            reference = prefilled(runner, prompt[:reused])
            for layer, expected in zip(cache.layers, reference.layers, strict=True):
                torch.testing.assert_close(layer.keys, expected.keys, rtol=1e-5, atol=1e-5)
        runner.forward(torch.tensor([prompt[reused:]]), cache, last_only=True)
        prefixes.store(prompt, cache)
        kept.append(prompt)
        assert prefixes.bytes <= prefixes.max_bytes
        assert prefixes.bytes == sum(node.bytes for node in prefixes._nodes())


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_a_prompt_that_cannot_fit_evicts_nothing() -> None:
    runner = ModelTuning(tiny_model("llama")).runner
    per_token = sum(2 * layer.keys.nbytes for layer in prefilled(runner, [1]).layers)
    prefixes = PrefixCache(6 * per_token)
    prefixes.store([1, 2, 3, 4], prefilled(runner, [1, 2, 3, 4]))
    prefixes.store([5, 6], prefilled(runner, [5, 6]))
    # Its branch below 1 2 3 4 needs 3 more tokens: even with 5 6 gone, 4 + 3 > 6.
    prefixes.store([1, 2, 3, 4, 7, 7, 7], prefilled(runner, [1, 2, 3, 4, 7, 7, 7]))
    assert prefixes.bytes == 6 * per_token and prefixes.lookup([5, 6, 0])[1] == 2
