"""The engine's batch on a static step (`LookaheadConfig.step`): every row padded to a bucket
of a few fixed shapes over preallocated slots (`rag_lookahead.runtime.static`), as a captured
step runs on a GPU; on a CPU everything but the capture. Every answer is the plain greedy one,
on every family the property tests cover, sliding windows included, calls joining and leaving
at any step; where the step named cannot run, the engine says why and runs eager."""

from __future__ import annotations

import random
import warnings
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.engine.rows import Rows
from rag_lookahead.runtime.static import StaticBatch
from rag_lookahead.testing import CharTokenizer, greedy_reference, run_together, tiny_model
from rag_lookahead.testing.models import FAMILIES, SLIDING_FAMILIES, VOCAB, sliding_model
from rag_lookahead.tuning.step_choice import StepSettings

PROMPT = [3, 14, 15, 9, 26, 3, 14, 15, 9, 26, 5, 3, 14]


def static_engine(model, **config) -> LookaheadEngine:
    settings = {"mode": "trie", "min_query_length": 1, "step": "static", "max_model_len": 128, **config}
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(**settings))
    assert engine.backend.step == "static" and engine.runner.static is not None
    return engine


def jobs_of(rng: random.Random, calls: int) -> list[tuple[list[int], GenerationParams]]:
    """Prompts of repeated tokens (so that drafts are accepted), with random budgets."""
    jobs = []
    for _ in range(calls):
        base = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 4))]
        prompt = (base * 12)[: rng.randint(2, 40)]
        jobs.append((prompt, GenerationParams(max_new_tokens=rng.randint(1, 24))))
    return jobs


@settings(max_examples=12, deadline=None)
@given(
    family=st.sampled_from([*FAMILIES, *(f"sliding-{f}" for f in SLIDING_FAMILIES)]),
    mode=st.sampled_from(["trie", "jacobi", "auto", "off"]),
    seed=st.integers(0, 10_000),
    calls=st.integers(1, 5),
    stagger=st.integers(0, 3),
    batch=st.sampled_from([1, 2, 3, 8]),
)
def test_calls_on_a_static_step_give_each_its_own_greedy_output(family, mode, seed, calls, stagger, batch):
    sliding = family.startswith("sliding-")
    model = sliding_model(family.removeprefix("sliding-")) if sliding else tiny_model(family)
    engine = static_engine(model, mode=mode, max_batch_size=batch)
    jobs = jobs_of(random.Random(seed), calls)
    completions = run_together(engine, jobs, stagger)
    for (prompt, params), done in zip(jobs, completions, strict=True):
        assert done.token_ids == greedy_reference(model, prompt, params.max_new_tokens)
    stepped = any(len(done.token_ids) > 1 for done in completions)  # (the first is the prefill's)
    static = engine.runner.static
    assert static is not None and (sum(b.replays for b in static._buffers.values()) > 0 or not stepped)


def test_rows_leave_and_join_their_slots_with_drafts_accepted() -> None:
    model = tiny_model("llama")
    engine = static_engine(model, max_batch_size=4)
    jobs = [(PROMPT[: 6 + i], GenerationParams(max_new_tokens=8 + 5 * i)) for i in range(6)]
    done = run_together(engine, jobs, stagger=1)
    assert [d.token_ids for d in done] == [greedy_reference(model, p, g.max_new_tokens) for p, g in jobs]
    assert sum(sum(d.stats.accepted_per_step) for d in done) > 0  # drafts were verified and kept
    buckets = {b for b, buffers in engine.runner.static._buffers.items() if buffers.replays}
    assert {rows for rows, _ in buckets} >= {1, 2, 4} and any(width > 1 for _, width in buckets)


def test_a_call_longer_than_the_slots_decodes_alone_beside_the_batch() -> None:
    model = tiny_model("llama")
    engine = static_engine(model, max_model_len=64)
    long_prompt = [(7 * i) % VOCAB for i in range(30)]
    jobs = [(PROMPT, GenerationParams(max_new_tokens=12)), (long_prompt, GenerationParams(max_new_tokens=12))]
    short, long = run_together(engine, jobs, stagger=0)
    assert short.token_ids == greedy_reference(model, PROMPT, 12)
    assert long.token_ids == greedy_reference(model, long_prompt, 12)  # 30 + 12 + 32 > 64
    assert set(long.stats.undrafted_steps) == {"beyond_max_model_len"}
    assert "beyond_max_model_len" not in short.stats.undrafted_steps


def test_sampling_on_a_static_step_draws_what_the_eager_step_draws() -> None:
    model = tiny_model("qwen2")
    params = GenerationParams(max_new_tokens=16, do_sample=True, temperature=1.2, seed=5)
    eager = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    assert static_engine(model).complete(PROMPT, params).token_ids == eager.complete(PROMPT, params).token_ids


def test_the_step_is_chosen_and_says_why_when_it_is_not_the_one_named() -> None:
    model = tiny_model("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto on a CPU runs eager, and says nothing
        auto = LookaheadEngine(model, CharTokenizer(), LookaheadConfig())
    assert auto.backend.step == "eager" and auto.backend.step_problem is None and auto.runner.static is None
    with pytest.warns(UserWarning, match="run eager, not captured .*CUDA"):
        named = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(step="captured"))
    assert named.backend.step == "eager" and "CUDA" in (named.backend.step_problem or "")
    assert named.backend.as_dict()["step_problem"] == named.backend.step_problem
    assert "step eager (named) (captured graphs run on CUDA" in str(named.backend)
    static = static_engine(model)
    assert "step static (named)" in str(static.backend) and static.backend.as_dict()["step"] == "static"
    assert named.complete(PROMPT, max_new_tokens=8).token_ids == greedy_reference(model, PROMPT, 8)


def test_a_changed_model_keeps_its_slots_and_its_answers() -> None:
    model = tiny_model("llama")
    engine = static_engine(model)
    step = engine.runner.static
    first = engine.complete(PROMPT, max_new_tokens=12).token_ids
    handle = model.model.layers[0].register_forward_hook(lambda *args: None)
    try:
        assert engine.complete(PROMPT, max_new_tokens=12).token_ids == first  # derived again
        assert engine.runner.static is step and engine.backend.step == "static"
    finally:
        handle.remove()
    assert first == greedy_reference(model, PROMPT, 12)


def test_step_settings_ladder_the_rows_up_to_the_batch_and_cut_the_columns() -> None:
    assert StepSettings(rows=8).buckets().rows == (1, 2, 4, 8)
    assert StepSettings(rows=6).buckets().rows == (1, 2, 4, 6)
    assert StepSettings(rows=1).buckets().rows == (1,)
    model = tiny_model("llama")
    assert StepSettings(max_len=10**6).columns(model) == model.config.max_position_embeddings
    for bad in ({"named": "graphs"}, {"max_len": 0}, {"rows": 0}):
        with pytest.raises(ValueError):
            StepSettings(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["trie", "jacobi", "auto"])
def test_drafts_wider_than_the_widest_bucket_are_cut_to_it(mode: str) -> None:
    model = tiny_model("llama")
    engine = static_engine(model, mode=mode, decoding_length=48, branch_length=40)
    done = engine.complete(PROMPT * 3, max_new_tokens=20)
    assert done.token_ids == greedy_reference(model, PROMPT * 3, 20)
    assert max(done.stats.drafted_per_step) < engine.runner.static.buckets.widest


def test_a_replaced_weight_has_the_graphs_captured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay reads each weight where it was when captured: a weight replaced (not written
    in place) has the buckets captured again, before the next call's steps. (On a CPU nothing
    is captured: the capture is stood in for, the addresses compared are the real ones.)"""
    model = tiny_model("llama")
    engine = static_engine(model)
    step = engine.runner.static
    captures: list[int] = []

    def capture(*args, **kwargs) -> None:
        captures.append(1)
        step._weights = tuple(t.data_ptr() for t in (*model.parameters(), *model.buffers()))

    monkeypatch.setattr(type(step), "captured", property(lambda self: ("1x1",)))
    monkeypatch.setattr(step, "capture", capture)
    capture()
    weight = model.model.layers[0].mlp.up_proj.weight
    with torch.no_grad():
        weight.mul_(1.0)  # in place: the graphs read the new values where they were
    engine.complete(PROMPT, max_new_tokens=2)
    assert captures == [1]
    weight.data = weight.data.clone()  # replaced: elsewhere now
    engine.complete(PROMPT, max_new_tokens=2)
    assert captures == [1, 1] and engine.backend.captured == ("1x1",)


def test_rows_in_a_static_step_s_slots_keep_its_rules_after_the_runner_went_eager() -> None:
    """A change of the model may switch the runner to eager steps while rows decode in a
    static step's slots: they go on there, planned no wider than its widest bucket and joined
    only by calls its slots hold; an empty batch follows the runner."""
    step = static_engine(tiny_model("llama"), max_model_len=64).runner.static
    assert step is not None
    eager = SimpleNamespace(runner=SimpleNamespace(static=None))
    rows = Rows(eager, None, None)  # type: ignore[arg-type]
    assert rows.slots() is None and rows.widest() is None and rows.takes(10**6)
    rows.cache, rows.calls = StaticBatch(step), [object()]  # type: ignore[list-item]
    assert rows.slots() is step and rows.widest() == step.buckets.widest
    assert rows.takes(64 - step.buckets.widest) and not rows.takes(64 - step.buckets.widest + 1)
