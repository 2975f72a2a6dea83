"""The direct forward (`rag_lookahead.runtime.direct`): the model's own logits and cache entries,
bit for bit, wherever the runner uses it; the model's own forward wherever it could differ."""

import copy
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.runtime import direct as direct_module
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.direct import DirectForward
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.testing import (
    ASCII_VOCAB,
    FAMILIES,
    VOCAB,
    AsciiTokenizer,
    CharTokenizer,
    greedy_reference,
    random_tree,
    sliding_model,
    tiny_model,
)
from rag_lookahead.tuning import ModelTuning

DIRECT = ("llama", "qwen2", "mistral")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_llama_shaped_families_run_directly(family: str) -> None:
    runner = ModelTuning(tiny_model(family)).runner
    assert (runner.direct is not None) == (family in DIRECT)
    assert runner.backend.forward == ("direct" if family in DIRECT else "model")


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_sliding_windows_run_the_model(family: str) -> None:
    assert DirectForward.of(sliding_model(family)) is None


def test_turned_off_or_unmatched_runs_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("llama")
    assert ModelTuning(model, direct=False).runner.direct is None
    monkeypatch.setattr(direct_module, "_rotate_half", lambda x: x)  # a forward that differs
    assert ModelTuning(model).runner.direct is None


def _runners(family: str) -> tuple[ModelRunner, ModelRunner]:
    model = tiny_model(family)
    direct, own = ModelTuning(model).runner, ModelTuning(model, direct=False).runner
    assert direct.direct is not None and own.direct is None
    return direct, own


def _tree(rng: random.Random, size: int) -> StepDraft:
    """A random tree's shape with distinct tokens of the tiny models' vocabulary."""
    shape = random_tree(rng, size)
    return StepDraft(DraftTree(tuple(rng.sample(range(VOCAB), size)), shape.parents))


def _entries(cache: object) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("family", DIRECT)
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40),
    size=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_prompt_step_and_tree_are_the_models_bit_for_bit(
    family: str, prompt: list[int], size: int, seed: int
) -> None:
    tree = _tree(random.Random(seed), size)
    results = []
    for runner in _runners(family):
        logits, cache = runner.forward(torch.tensor([prompt]), None)
        step, cache = runner.forward(torch.tensor([[prompt[0]]]), cache)
        _, grown = runner.forward(torch.tensor([prompt]), new_tree_cache(), last_only=True)
        verified, grown = runner.forward_step(tree, grown, len(prompt))
        results.append([logits, step, verified, *_entries(cache), *_entries(grown)])
    got, want = results
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("family", DIRECT)
def test_batched_steps_are_the_models_bit_for_bit(family: str) -> None:
    rng = random.Random(family)
    drafts = [_tree(rng, size) for size in (5, 1, 3)]
    prompts = [torch.tensor([[rng.randrange(VOCAB) for _ in range(length)]]) for length in (4, 17, 9)]
    results = []
    for runner in _runners(family):
        results.append([])
        for packs in (False, True) if runner.packs() else (False,):
            batch = BatchCache(packed=packs)
            for prompt in prompts:
                _, row = runner.forward(prompt, new_tree_cache())
                batch.add_row(row, expected_rows=3)
            if packs:
                batch.prepare(packed := runner.packed_inputs(drafts, batch.lengths))
                results[-1].append(runner.forward_packed(packed, batch.cache, batch.lengths))
            else:
                batch.prepare()
                inputs = batch_inputs(drafts, batch.lengths, runner.device, runner.model.dtype)
                results[-1].append(runner.forward_batch(inputs, batch.cache, batch.lengths))
            results[-1] += [t for i in range(batch.rows) for t in _entries(batch.row_view(i))]
    got, want = results
    assert len(got) == len(want)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("family", DIRECT)
def test_greedy_answers_equal_generate_either_way(family: str) -> None:
    model = tiny_model(family)
    prompt = list(range(3, 40, 3))
    want = greedy_reference(model, prompt, 20)
    for direct in (True, False):
        engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", direct_forward=direct))
        assert (engine.runner.direct is not None) == direct
        engine.trie.insert(want[2:15], OUTPUT_OWNER)
        assert engine.complete(prompt, max_new_tokens=20).token_ids == want


def test_a_hook_added_later_is_called() -> None:
    model = tiny_model("llama", 1, ASCII_VOCAB)
    engine = LookaheadEngine(model, AsciiTokenizer(), LookaheadConfig(mode="off"))
    assert engine.runner.direct is not None
    calls = []
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *_: calls.append(1))
    try:
        assert not engine.runner.direct.applies()
        engine.complete("hello", max_new_tokens=3)
    finally:
        handle.remove()
    assert calls and engine.runner.direct.applies()


def test_training_mode_runs_the_model() -> None:
    model = tiny_model("llama", 1, ASCII_VOCAB)
    direct = DirectForward.of(model)
    assert direct is not None and direct.applies()
    model.train()
    try:
        assert not direct.applies()
    finally:
        model.eval()


def test_the_setting_is_checked_and_kept_per_engine() -> None:
    with pytest.raises(ValueError, match="direct_forward must be True or False"):
        LookaheadConfig(direct_forward="yes")  # type: ignore[arg-type]
    engine = LookaheadEngine(
        tiny_model("llama", 1, ASCII_VOCAB), AsciiTokenizer(), LookaheadConfig(mode="off")
    )
    with pytest.raises(ValueError, match="direct_forward is set per engine"):
        engine.with_config(LookaheadConfig(mode="off", direct_forward=False))


def test_a_layer_replaced_later_is_called() -> None:
    model = copy.deepcopy(tiny_model("llama", 1, ASCII_VOCAB))
    engine = LookaheadEngine(model, AsciiTokenizer(), LookaheadConfig(mode="off"))
    assert engine.runner.direct is not None
    calls = []

    class Counted(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(1)
            return super().forward(x)

    old = model.model.layers[1].self_attn.o_proj
    new = Counted(old.in_features, old.out_features, bias=False)
    new.load_state_dict(old.state_dict())
    model.model.layers[1].self_attn.o_proj = new
    assert not engine.runner.direct.applies()
    engine.complete("hello", max_new_tokens=3)
    assert calls


def test_a_global_hook_or_an_embedding_that_renormalises_runs_the_model() -> None:
    model = tiny_model("llama", 1, ASCII_VOCAB)
    direct = DirectForward.of(model)
    assert direct is not None
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *_: None)
    try:
        assert not direct.applies()
    finally:
        handle.remove()
    assert direct.applies()
    renormalising = copy.deepcopy(model)
    renormalising.model.embed_tokens.max_norm = 1.0  # (it rewrites the weights it reads)
    assert DirectForward.of(renormalising) is None
