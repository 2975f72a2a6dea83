"""Trees on models with sliding-window layers: exact masks, and lossless decoding on prompts
several times longer than the window (alone and batched)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.kv_cache import cache_kwarg, new_tree_cache
from rag_lookahead.runtime.layer_masks import LayerMasks, cut_window
from rag_lookahead.testing import (
    SLIDING_FAMILIES,
    SLIDING_WINDOW,
    VOCAB,
    CharTokenizer,
    greedy_reference,
    run_together,
    sliding_config,
    sliding_model,
)
from rag_lookahead.tuning import ModelTuning
from rag_lookahead.tuning.probes import tree_support_problem

NEW_TOKENS = 24


def random_tree(rng: random.Random, size: int) -> DraftTree:
    parents = [-1] + [rng.randrange(i) for i in range(1, size)]
    return DraftTree(tuple(rng.sample(range(VOCAB), size)), tuple(parents))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), window=st.integers(1, 12))
def test_the_window_is_cut_node_by_node_at_each_nodes_own_position(seed: int, window: int) -> None:
    rng = random.Random(seed)
    drafts = [StepDraft(random_tree(rng, rng.randint(1, 6))) for _ in range(rng.randint(1, 3))]
    lengths = [rng.randint(0, 20) for _ in drafts]
    inputs = batch_inputs(drafts, lengths, torch.device("cpu"), torch.float32)
    got = cut_window(inputs.attention_mask, inputs.position_ids, lengths, window)[:, 0] == 0
    base = inputs.attention_mask[:, 0] == 0
    for i, (draft, length) in enumerate(zip(drafts, lengths, strict=True)):
        for q in range(inputs.position_ids.shape[1]):
            for c in range(got.shape[-1]):
                key = c if c < length else None
                if length <= c < length + inputs.position_ids.shape[1]:
                    key = int(inputs.position_ids[i, c - length])
                near = key is not None and int(inputs.position_ids[i, q]) - key < window
                assert bool(got[i, q, c]) == (bool(base[i, q, c]) and near)
        assert got[i, : len(draft)].any(-1).all()  # every real query still sees something


class Unwindowed(LayerMasks):
    """Knows the window but hands every layer the full tree mask (the old behaviour)."""

    def __call__(self, inputs, lengths):  # type: ignore[no-untyped-def]
        return inputs.attention_mask


@pytest.mark.parametrize("family", SLIDING_FAMILIES)
def test_the_probe_passes_sliding_models_and_catches_a_mask_without_the_window(family: str) -> None:
    model = sliding_model(family)
    masks = LayerMasks.of(model.config)
    assert masks.window == SLIDING_WINDOW and not masks.unsupported
    assert masks.by_type == (family != "mistral")  # mistral: every layer slides, one mask
    assert tree_support_problem(model, cache_kwarg(model), masks) is None
    problem = tree_support_problem(model, cache_kwarg(model), Unwindowed(masks.window, masks.by_type))
    assert problem is not None and "mask" in problem


def test_layer_types_a_mask_cannot_express_mean_no_trees() -> None:
    config = sliding_config("gemma3")
    config.layer_types = ["sliding_attention", "chunked_attention", "full_attention", "full_attention"]
    masks = LayerMasks.of(config)
    assert masks.unsupported == ("chunked_attention",)
    problem = tree_support_problem(sliding_model("gemma3"), "cache", masks)
    assert problem is not None and "chunked_attention" in problem


def test_full_layers_only_take_one_plain_mask() -> None:
    config = sliding_config("qwen2")
    config.layer_types = ["full_attention"] * 4
    assert LayerMasks.of(config) == LayerMasks(None, False)


@pytest.mark.parametrize("family", SLIDING_FAMILIES)
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 2**16),
    length=st.integers(3 * SLIDING_WINDOW, 6 * SLIDING_WINDOW),
    decoding_length=st.integers(1, 16),
    mode=st.sampled_from(["trie", "auto", "jacobi"]),
)
def test_sliding_models_decode_losslessly_past_the_window(
    family: str, seed: int, length: int, decoding_length: int, mode: str
) -> None:
    rng = random.Random(seed)
    model = sliding_model(family)
    prompt = [rng.randrange(VOCAB) for _ in range(length)]
    reference = greedy_reference(model, prompt, NEW_TOKENS)
    config = LookaheadConfig(
        mode=mode,  # type: ignore[arg-type]
        decoding_length=decoding_length,
        ngram_size=min(4, decoding_length + 1),
        min_query_length=1,
    )
    engine = LookaheadEngine(model, CharTokenizer(), config)
    start = rng.randrange(NEW_TOKENS)
    engine.trie.insert(reference[start : start + rng.randint(2, 16)], OUTPUT_OWNER)  # part of the answer
    engine.trie.insert([rng.randrange(VOCAB) for _ in range(20)], OUTPUT_OWNER)  # junk
    completion = engine.complete(prompt, max_new_tokens=NEW_TOKENS)
    assert completion.token_ids == reference


@pytest.mark.parametrize("family", SLIDING_FAMILIES)
def test_the_whole_answer_in_the_trie_is_verified_in_trees_past_the_window(family: str) -> None:
    model = sliding_model(family)
    prompt = [(5 * i + 3) % VOCAB for i in range(5 * SLIDING_WINDOW)]
    reference = greedy_reference(model, prompt, NEW_TOKENS)
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    engine.trie.insert(prompt + reference, OUTPUT_OWNER)
    completion = engine.complete(prompt, max_new_tokens=NEW_TOKENS)
    assert completion.token_ids == reference
    assert engine.tree_verification
    assert completion.stats.steps < NEW_TOKENS // 2  # more than two tokens per forward


@pytest.mark.parametrize("family", ["gemma3", "mistral", "cohere2", "qwen2"])
def test_a_packed_step_past_the_window_matches_the_padded_one(family: str) -> None:
    """Each row's queries in a sliding layer see only the window before their own position."""
    runner = ModelTuning(sliding_model(family)).runner
    assert runner.packs()
    rng = random.Random(family)
    lengths = [3 * SLIDING_WINDOW, 2, SLIDING_WINDOW + 1]
    drafts = [
        StepDraft(random_tree(rng, 5)),
        StepDraft(DraftTree.root_only(7)),
        StepDraft(random_tree(rng, 3)),
    ]
    prompts = [[rng.randrange(VOCAB) for _ in range(length)] for length in lengths]
    batches = []
    for packs in (False, True):
        batch = BatchCache(packed=packs)
        for prompt in prompts:
            cache = new_tree_cache()
            runner.forward(torch.tensor([prompt]), cache, last_only=True)
            batch.add_row(cache)
        batches.append(batch)
    batches[0].prepare()
    padded = batch_inputs(drafts, lengths, runner.device, torch.float32)
    want = runner.forward_batch(padded, batches[0].cache, lengths)  # [3, 5, V]
    packed = runner.packed_inputs(drafts, lengths)
    batches[1].prepare(packed)
    got = runner.forward_packed(packed, batches[1].cache, lengths)  # [9, V]
    for i, (offset, size) in enumerate(zip(packed.offsets, packed.sizes, strict=True)):
        torch.testing.assert_close(got[offset : offset + size], want[i, :size], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["gemma3", "mistral", "gpt_oss"])
@pytest.mark.parametrize("inside", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_batched_calls_on_a_sliding_model_each_get_their_own_greedy_output(
    family: str, inside: bool, packed: bool
) -> None:
    """``inside``: joining prompts ride in the running rows' steps (a flat cost curve);
    ``packed``: the steps packed where the model allows it (not gpt_oss: eager attention)."""
    from rag_lookahead.planning.costs import CostCurve

    rng = random.Random(family)
    model = sliding_model(family)
    config = LookaheadConfig(mode="trie", min_query_length=1, max_batch_size=4, max_tokens_per_forward=24)
    engine = LookaheadEngine(model, CharTokenizer(), config)
    assert engine.runner.packs() == (family != "gpt_oss")
    if not packed:
        runner = engine.runner  # (the probe's answer, overridden: padded steps)
        padding = replace(runner.backend, batch_layout="padded")
        runner.use(padding, layers=runner.linear.layers, direct=runner.direct)
    engine.planner.cost_curve = CostCurve.flat() if inside else None
    jobs = []
    for _ in range(4):
        base = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 5))]
        prompt = (base * 20)[: rng.randint(2 * SLIDING_WINDOW, 6 * SLIDING_WINDOW)]
        jobs.append((prompt, GenerationParams(max_new_tokens=rng.randint(8, NEW_TOKENS))))
    for (prompt, params), completion in zip(jobs, run_together(engine, jobs, stagger=1), strict=True):
        assert completion.token_ids == greedy_reference(model, prompt, params.max_new_tokens)
