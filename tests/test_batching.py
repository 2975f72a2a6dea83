"""Continuous batching: rows of different calls in one forward, each computed as if alone."""

from __future__ import annotations

import gc
import itertools
import random
import threading
import time
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, StepDraft, packed_inputs
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.runtime.threads import ModelThread
from rag_lookahead.testing import (
    FAMILIES,
    VOCAB,
    CharTokenizer,
    greedy_reference,
    run_together,
    tiny_model,
)
from rag_lookahead.tuning import ModelTuning

TREE = DraftTree((7, 8, 9, 10), (-1, 0, 1, 0))  # 7 -> 8 -> 9 ; 7 -> 10


def prefilled(runner: ModelRunner, prompt: list[int]):
    cache = new_tree_cache()
    runner.forward(torch.tensor([prompt]), cache, last_only=True)
    return cache


def test_batch_inputs_show_each_row_its_own_tokens_and_branches() -> None:
    drafts = [StepDraft(TREE), StepDraft(DraftTree.root_only(4))]
    inputs = batch_inputs(drafts, [3, 2], torch.device("cpu"), torch.float32)
    assert inputs.input_ids.tolist() == [[7, 8, 9, 10], [4, 4, 4, 4]]  # pads repeat the root
    assert inputs.position_ids.tolist() == [[3, 4, 5, 4], [2, 2, 2, 2]]
    seen = (inputs.attention_mask[:, 0] == 0).int().tolist()
    # Row 0: three cached tokens, then its tree at columns 3-6.
    assert seen[0] == [
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0, 0, 1],
    ]
    # Row 1: two cached tokens, its root at column 2, pads that see only themselves, and a
    # last column (stale for this row) that nobody sees.
    assert seen[1] == [
        [1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batched_step_matches_each_row_alone(family: str) -> None:
    runner = ModelTuning(tiny_model(family)).runner
    prompts = [[3, 14, 15, 9, 26, 5], [2, 7], [18, 28, 18, 28, 45, 90, 45, 23, 5]]
    branchy = DraftTree((5, 8, 9, 10), (-1, 0, 1, 0))
    drafts = [StepDraft(branchy), StepDraft(DraftTree.root_only(7)), StepDraft(TREE)]
    alone = []
    for prompt, draft in zip(prompts, drafts, strict=True):
        logits, _ = runner.forward_step(draft, prefilled(runner, prompt[:-1]), len(prompt) - 1)
        alone.append(logits)
    batch = BatchCache()
    for prompt in prompts:
        batch.add_row(prefilled(runner, prompt[:-1]))
    batch.prepare()
    inputs = batch_inputs(drafts, batch.lengths, runner.device, torch.float32)
    logits = runner.forward_batch(inputs, batch.cache, batch.lengths)  # [3, 4, V]
    for i, draft in enumerate(drafts):
        torch.testing.assert_close(logits[i, : len(draft)], alone[i], rtol=1e-4, atol=1e-4)


def test_packed_inputs_are_the_padded_rows_without_their_padding() -> None:
    drafts = [StepDraft(TREE), StepDraft(DraftTree.root_only(4)), StepDraft(DraftTree((5, 6), (-1, 0)))]
    padded = batch_inputs(drafts, [3, 2, 5], torch.device("cpu"), torch.float32)
    packed = packed_inputs(drafts, [3, 2, 5], torch.device("cpu"), torch.float32)
    assert packed.input_ids.tolist() == [[7, 8, 9, 10, 4, 5, 6]]
    assert packed.position_ids.tolist() == [[3, 4, 5, 4, 2, 5, 6]]
    assert (packed.offsets, packed.sizes) == ((0, 4, 5), (4, 1, 2))
    assert packed.rows.tolist() == [0, 0, 0, 0, 1, 2, 2]
    assert packed.masks[1] is None  # a lone root sees its whole cache and itself
    assert packed.masks[0] is not None and packed.masks[2] is not None
    torch.testing.assert_close(packed.masks[0], padded.attention_mask[:1, :, :4, :7])
    torch.testing.assert_close(packed.masks[2], padded.attention_mask[2:, :, :2, :7])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_packed_step_matches_the_padded_one_and_writes_the_same_cache(family: str) -> None:
    runner = ModelTuning(tiny_model(family)).runner
    assert runner.packs()
    prompts = [[3, 14, 15, 9, 26, 5], [2, 7], [18, 28, 18, 28, 45, 90, 45, 23, 5]]
    branchy = DraftTree((5, 8, 9, 10), (-1, 0, 1, 0))
    chunk = DraftTree((23, 5, 7), (-1, 0, 1))  # a prompt's chunk: a chain
    drafts = [StepDraft(branchy), StepDraft(DraftTree.root_only(7)), StepDraft(chunk)]
    batches = []
    for packs in (False, True):
        batch = BatchCache(packed=packs)
        for prompt in prompts:
            batch.add_row(prefilled(runner, prompt[:-1]))
        batches.append(batch)
    batches[0].prepare()
    padded = batch_inputs(drafts, batches[0].lengths, runner.device, torch.float32)
    want = runner.forward_batch(padded, batches[0].cache, batches[0].lengths)  # [3, 4, V]
    packed = packed_inputs(drafts, batches[1].lengths, runner.device, torch.float32)
    batches[1].prepare(packed)
    got = runner.forward_packed(packed, batches[1].cache, batches[1].lengths)  # [8, V]
    keep = [0, 1, 2, 3, 4, 7]  # every draft node, and the chunk's last token
    kept = runner.forward_packed(packed, batches[1].cache, batches[1].lengths, keep)
    torch.testing.assert_close(kept, got[keep])
    for i, (offset, size) in enumerate(zip(packed.offsets, packed.sizes, strict=True)):
        torch.testing.assert_close(got[offset : offset + size], want[i, :size], rtol=1e-4, atol=1e-4)
    nodes = [[0, 3], [0], [0, 1, 2]]
    for batch in batches:
        batch.keep_accepted(4 if batch is batches[0] else 3, nodes)
    assert batches[0].lengths == batches[1].lengths == [7, 2, 11]
    for i in range(3):
        ours, theirs = batches[1].row_view(i), batches[0].row_view(i)
        for mine, its in zip(ours.layers, theirs.layers, strict=True):
            torch.testing.assert_close(mine.keys, its.keys)
            torch.testing.assert_close(mine.values, its.values)


def test_a_model_attending_its_own_way_is_not_packed() -> None:
    """Packing needs the engine's own attention function: an eager model (as, on CUDA, every
    model) steps padded, and the probe never assumes."""
    from transformers import AutoModelForCausalLM

    from rag_lookahead.testing.models import tiny_config

    model = AutoModelForCausalLM.from_config(tiny_config("llama"), attn_implementation="eager").eval()
    runner = ModelTuning(model).runner
    assert runner.backend.trees and not runner.packs()


def test_each_row_keeps_only_its_accepted_path() -> None:
    runner = ModelTuning(tiny_model("llama")).runner
    batch = BatchCache()
    for prompt in ([3, 14, 15, 9], [2, 7, 1]):
        batch.add_row(prefilled(runner, prompt))
    drafts = [StepDraft(TREE), StepDraft(DraftTree((1, 2), (-1, 0)))]
    batch.prepare()
    runner.forward_batch(
        batch_inputs(drafts, batch.lengths, runner.device, torch.float32), batch.cache, batch.lengths
    )
    batch.keep_accepted(4, [[0, 3], [0]])  # row 0 took the second branch, row 1 nothing
    assert batch.lengths == [6, 4]
    rows = [prefilled(runner, [3, 14, 15, 9, 7, 10]), prefilled(runner, [2, 7, 1, 1])]
    for layer, row0, row1 in zip(batch.cache.layers, rows[0].layers, rows[1].layers, strict=True):
        torch.testing.assert_close(layer.key_buffer[0, :, :6], row0.keys[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(layer.value_buffer[1, :, :4], row1.values[0], rtol=1e-4, atol=1e-4)
    batch.keep_rows([1])  # row 0's call left: row 1 decodes alone, in a cache of its own
    assert batch.lengths == [4] and batch.cache.get_seq_length() == 4
    torch.testing.assert_close(batch.cache.layers[0].keys[0], rows[1].layers[0].keys[0], rtol=1e-4, atol=1e-4)


def random_jobs(rng: random.Random, calls: int, shortest: int) -> list[tuple[list[int], GenerationParams]]:
    """Prompts of repeated tokens, half of them starting like an earlier one (so that its prefix
    is reused), with random budgets."""
    jobs: list[tuple[list[int], GenerationParams]] = []
    for _ in range(calls):
        base = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 4))]
        prompt = (base * rng.randint(2, 12))[: rng.randint(shortest, 40)]
        if jobs and rng.random() < 0.5:
            earlier = rng.choice(jobs)[0]
            prompt = earlier[: rng.randint(1, len(earlier))] + prompt[: rng.randint(0, 8)]
        jobs.append((prompt, GenerationParams(max_new_tokens=rng.randint(1, 24))))
    return jobs


def assert_each_greedy(model, engine: LookaheadEngine, jobs, stagger) -> None:
    """Run ``jobs`` together: each output is its prompt's greedy one, and no branch is left."""
    for (prompt, params), completion in zip(jobs, run_together(engine, jobs, stagger), strict=True):
        assert completion.token_ids == greedy_reference(model, prompt, params.max_new_tokens)
    assert engine.trie.owners() <= {OUTPUT_OWNER}


@settings(max_examples=12, deadline=None)
@given(
    family=st.sampled_from(FAMILIES),
    mode=st.sampled_from(["trie", "auto", "off"]),
    seed=st.integers(0, 10_000),
    calls=st.integers(2, 5),
    stagger=st.integers(0, 3),
    batch=st.sampled_from([2, 3, 8]),
    prefill_budget=st.sampled_from([1, 30, 2048]),  # a chunk a step, a few, every prompt at once
    packed=st.booleans(),
)
def test_concurrent_calls_give_each_its_own_greedy_output(
    family, mode, seed, calls, stagger, batch, prefill_budget, packed
) -> None:
    rng = random.Random(seed)
    model = tiny_model(family)
    config = LookaheadConfig(
        mode=mode,
        min_query_length=1,
        max_batch_size=batch,
        max_tokens_per_forward=24,
        max_prefill_tokens_per_step=prefill_budget,
    )
    engine = LookaheadEngine(model, CharTokenizer(), config, cost_curve=None)
    steps_padded(engine, not packed)
    if mode == "auto":
        from rag_lookahead.planning.costs import CostCurve

        engine.planner.cost_curve = CostCurve((1, 4, 32), (1.0, 1.2, 2.0))
    assert_each_greedy(model, engine, random_jobs(rng, calls, shortest=3), stagger)


def test_stop_strings_and_cancellations_do_not_disturb_the_other_rows() -> None:
    model = tiny_model("llama")
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    prompts = [[3, 14, 15, 9, 26], [2, 7, 1, 8, 2, 8], [5, 5, 5, 6], [9, 1]]
    references = [greedy_reference(model, p, 20) for p in prompts]
    stop = CharTokenizer().decode(references[1][6:8])
    streams = [
        engine.stream(prompts[0], max_new_tokens=20),
        engine.stream(prompts[1], max_new_tokens=20, stop_strings=[stop]),
        engine.stream(prompts[2], max_new_tokens=20),
        engine.stream(prompts[3], max_new_tokens=20),
    ]
    streams[2].close()  # cancelled while the others decode
    done = [s.complete() for s in streams]
    assert done[0].token_ids == references[0] and done[3].token_ids == references[3]
    assert done[1].stats.finish_reason == "stop_string"
    assert (
        done[1].text
        == CharTokenizer().decode(references[1])[: CharTokenizer().decode(references[1]).index(stop)]
    )
    assert done[2].stats.finish_reason == "abandoned"


def test_a_joining_prompt_is_prefilled_in_chunks_with_the_same_output() -> None:
    model = tiny_model("llama")
    config = LookaheadConfig(mode="trie", min_query_length=1, max_tokens_per_forward=8)
    engine = LookaheadEngine(model, CharTokenizer(), config)
    prefills: list[int] = []
    forward = engine.runner.forward

    def counting(input_ids, *args, **kwargs):
        prefills.append(input_ids.shape[1])
        return forward(input_ids, *args, **kwargs)

    engine.runner.forward = counting  # type: ignore[method-assign]
    long_prompt = [(7 * i) % VOCAB for i in range(45)]
    first = engine.stream([3, 14, 15], max_new_tokens=30)
    second = engine.stream(long_prompt, max_new_tokens=12)  # joins while the first decodes
    outputs = [first.complete(), second.complete()]
    assert outputs[1].token_ids == greedy_reference(model, long_prompt, 12)
    assert outputs[0].token_ids == greedy_reference(model, [3, 14, 15], 30)
    assert 45 not in prefills and prefills.count(8) >= 2  # the long prompt went in chunks


def test_seeded_sampling_does_not_depend_on_the_batch() -> None:
    model = tiny_model("qwen2")
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    params = GenerationParams(max_new_tokens=16, do_sample=True, temperature=1.2, seed=5)
    alone = engine.complete([4, 8, 15, 16], params)
    jobs = [
        ([4, 8, 15, 16], params),
        ([23, 42, 4, 8], params.with_overrides(seed=6)),
        ([4, 8, 15, 16], params),
    ]
    together = run_together(engine, jobs, stagger=0)
    assert together[0].token_ids == together[2].token_ids == alone.token_ids


def test_one_call_at_a_time_with_a_batch_of_one() -> None:
    model = tiny_model("llama")
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", max_batch_size=1))
    widths: list[int] = []
    forward_step = engine.runner.forward_step

    def single(draft, cache, past):
        widths.append(cache.layers[0].keys.shape[0])
        return forward_step(draft, cache, past)

    engine.runner.forward_step = single  # type: ignore[method-assign]
    jobs = [
        ([3, 14, 15], GenerationParams(max_new_tokens=10)),
        ([2, 7, 1], GenerationParams(max_new_tokens=10)),
    ]
    results = run_together(engine, jobs, stagger=0)
    assert [r.token_ids for r in results] == [greedy_reference(model, p, 10) for p, _ in jobs]
    assert set(widths) == {1}


def test_a_failed_forward_fails_its_batch_and_the_engine_goes_on() -> None:
    model = tiny_model("llama")
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    name = batched_forward(engine.runner)
    forward_batch = getattr(engine.runner, name)
    failures = [1]

    def flaky(*args, **kwargs):
        if failures:
            failures.pop()
            raise RuntimeError("device lost")
        return forward_batch(*args, **kwargs)

    setattr(engine.runner, name, flaky)
    jobs = [
        ([3, 14, 15], GenerationParams(max_new_tokens=10)),
        ([2, 7, 1], GenerationParams(max_new_tokens=10)),
    ]
    streams = [engine.stream(p, params) for p, params in jobs]
    for stream in streams:
        with pytest.raises(RuntimeError, match="device lost"):
            stream.complete()
    assert engine.trie.owners() <= {OUTPUT_OWNER}
    assert engine.complete([3, 14, 15], max_new_tokens=10).token_ids == greedy_reference(
        model, [3, 14, 15], 10
    )


def test_a_call_waiting_for_a_place_is_cancelled_at_once() -> None:
    model = tiny_model("llama")
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", max_batch_size=1))
    with engine.runner.lock:  # the model is busy: nothing decodes until the block ends
        running = engine.stream([3, 14, 15], max_new_tokens=10)
        waiting = engine.stream([2, 7, 1], max_new_tokens=10)  # the batch (of one) is full
        waiting.close()  # returns at once: the call never started
        assert waiting.stats.finish_reason == "abandoned" and waiting.complete().token_ids == []
    assert running.complete().token_ids == greedy_reference(model, [3, 14, 15], 10)


def test_a_new_call_is_queued_while_another_thread_runs_a_forward() -> None:
    """Asking whether the model verifies trees (every call does) waits for no forward once it
    is known: a thread looping over forwards would otherwise keep new calls out of the batch."""
    model = tiny_model("llama")
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie"))
    assert engine.backend.trees  # probed
    holding, release = threading.Event(), threading.Event()

    def busy_model() -> None:
        with engine.runner.lock:  # a forward under way, in another thread
            holding.set()
            release.wait()

    holder = threading.Thread(target=busy_model)
    holder.start()
    holding.wait()
    streams = []
    opener = threading.Thread(target=lambda: streams.append(engine.stream([3, 14, 15], max_new_tokens=10)))
    opener.start()
    opener.join(timeout=30)
    queued = not opener.is_alive()
    release.set()
    holder.join()
    opener.join()
    assert queued, "the call waited for the model's lock before it was queued"
    assert streams[0].complete().token_ids == greedy_reference(model, [3, 14, 15], 10)


def test_a_batch_is_planned_with_a_rows_curve_when_batch_costs_were_not_measured() -> None:
    """An engine given only a (steep) cost curve: its batched steps verify no drafts either."""
    from rag_lookahead.planning.costs import CostCurve

    model = tiny_model("llama")
    steep = CostCurve((1, 2), (1.0, 50.0))
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(min_query_length=1), cost_curve=steep)
    assert engine.planner.batch_costs is None
    engine.planner.acceptance.explore_every = 10**9  # no exploring plan verifies a node either
    prompt = [5, 6, 7, 8] * 6  # the trie has plenty to draft
    jobs = [(prompt, GenerationParams(max_new_tokens=16)), (prompt[1:], GenerationParams(max_new_tokens=16))]
    completions = run_together(engine, jobs, stagger=0)
    for (job_prompt, _), completion in zip(jobs, completions, strict=True):
        assert completion.token_ids == greedy_reference(model, job_prompt, 16)
        assert sum(completion.stats.drafted_per_step) == 0


def test_every_forward_runs_in_the_models_thread_whichever_threads_read() -> None:
    """Every thread that runs torch work on a CPU holds an OpenMP team that slows the others
    down: the readers only wait, and the model's one thread runs every forward."""
    model = tiny_model("llama")
    ran_in: set[threading.Thread] = set()
    hook = model.register_forward_hook(lambda *_: ran_in.add(threading.current_thread()))
    try:
        engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(min_query_length=1))
        jobs = [
            ([5, 6, 7, 8] * 3, GenerationParams(max_new_tokens=8)),
            ([1, 2, 3], GenerationParams(max_new_tokens=8)),
        ]
        run_together(engine, jobs, stagger=0)
        engine.complete([4, 4, 2], max_new_tokens=4)
    finally:
        hook.remove()  # the model is shared by the other tests
    assert ran_in == {engine.runner.thread._thread}


def test_a_call_decodes_before_it_is_read_and_a_model_thread_of_its_own_ends_with_its_engines() -> None:
    engine = LookaheadEngine(
        tiny_model("llama"), CharTokenizer(), LookaheadConfig(), model_thread=ModelThread()
    )
    stream = engine.stream([3, 1, 4, 1, 5], max_new_tokens=6)
    deadline = time.monotonic() + 60  # (a bound on a hang, not a timing claim)
    while stream.stats.new_tokens < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.stats.new_tokens == 6  # nobody read it yet
    assert len(stream.complete().token_ids) == 6
    thread = engine.runner.thread._thread
    del engine, stream
    gc.collect()
    thread.join(timeout=60)
    assert not thread.is_alive()


def test_a_batch_allocates_its_rows_once_and_reuses_them_after_shrinking_to_one() -> None:
    runner = ModelTuning(tiny_model("llama")).runner
    prompts = [[3, 14, 15, 9], [2, 7, 1], [5, 5, 6], [8, 1, 8, 1, 2]]
    batch = BatchCache()
    batch.add_row(prefilled(runner, prompts[0]))
    batch.add_row(prefilled(runner, prompts[1]), expected_rows=3)
    buffer = batch.cache.layers[0].key_buffer
    assert buffer.shape[0] == 4  # three expected (doubled): room for the third without a copy
    batch.add_row(prefilled(runner, prompts[2]))
    assert batch.cache.layers[0].key_buffer is buffer
    batch.keep_rows([2])  # the others left: the last row decodes alone, in its own cache
    batch.add_row(prefilled(runner, prompts[3]))  # a batch again, in the same buffers
    assert batch.cache.layers[0].key_buffer is buffer
    drafts = [StepDraft(TREE), StepDraft(DraftTree((1, 2), (-1, 0)))]
    batch.prepare()
    inputs = batch_inputs(drafts, batch.lengths, runner.device, torch.float32)
    logits = runner.forward_batch(inputs, batch.cache, batch.lengths)
    for i, prompt in enumerate([prompts[2], prompts[3]]):
        alone, _ = runner.forward_step(drafts[i], prefilled(runner, prompt), len(prompt))
        torch.testing.assert_close(logits[i, : len(drafts[i])], alone, rtol=1e-4, atol=1e-4)


def _chain(tokens: int) -> StepDraft:
    return StepDraft(DraftTree(tuple(range(5, 5 + tokens)), tuple(range(-1, tokens - 1))))


def test_a_packed_batch_keeps_each_row_in_its_own_buffers() -> None:
    """A joining row brings its prefilled buffers, a row outgrowing its room grows alone, a
    leaving row moves nobody, and the last row decodes on in its own buffers: no row is ever
    copied for another's sake."""
    runner = ModelTuning(tiny_model("llama")).runner
    assert runner.packs()
    prompts = [[3, 14, 15, 9], [2, 7, 1], [5, 5, 6, 8, 1]]
    rows = [prefilled(runner, prompt) for prompt in prompts]
    buffers = [row.layers[0].keys.data_ptr() for row in rows]
    batch = BatchCache(packed=True)
    for row in rows:
        batch.add_row(row)
    drafts = [StepDraft(TREE), StepDraft(DraftTree.root_only(4)), _chain(80)]  # past row 2's room
    inputs = runner.packed_inputs(drafts, batch.lengths)
    batch.prepare(inputs)
    logits = runner.forward_packed(inputs, batch.cache, batch.lengths)  # [85, V]
    for i, (offset, size) in enumerate(zip(inputs.offsets, inputs.sizes, strict=True)):
        alone, _ = runner.forward_step(drafts[i], prefilled(runner, prompts[i]), len(prompts[i]))
        torch.testing.assert_close(logits[offset : offset + size], alone, rtol=1e-4, atol=1e-4)
    batch.keep_accepted(80, [[0, 3], [0], list(range(80))])
    assert batch.lengths == [6, 4, 85]
    moved = [batch.row_view(i).layers[0].keys.data_ptr() != buffers[i] for i in range(3)]
    assert moved == [False, False, True]
    assert batch.keep_rows([1]) == [1] and batch.lengths == [4]  # the others left
    assert batch.cache.layers[0].keys.data_ptr() == buffers[1]
    logits, _ = runner.forward(torch.tensor([[9]]), batch.cache)
    expected, _ = runner.forward(torch.tensor([[9]]), prefilled(runner, [2, 7, 1, 4]))
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    assert batch.cache.layers[0].keys.data_ptr() == buffers[1]  # appended in its room


def test_a_batch_takes_the_inputs_of_its_own_kind_only() -> None:
    drafts = [StepDraft(TREE), StepDraft(DraftTree.root_only(4))]
    for packed in (False, True):
        batch = BatchCache(packed=packed)
        inputs = packed_inputs(drafts, [3, 2], torch.device("cpu"), torch.float32)
        with pytest.raises(ValueError, match="packed batch takes packed inputs"):
            batch.prepare(None if packed else inputs)


def joining_engine(curve, max_tokens_per_forward: int = 8, family: str = "llama", **settings: Any):
    """An engine whose forwards cost as ``curve`` says (rows times width for a batch)."""
    model = tiny_model(family)
    config = LookaheadConfig(
        mode="trie", min_query_length=1, max_tokens_per_forward=max_tokens_per_forward, **settings
    )
    engine = LookaheadEngine(model, CharTokenizer(), config)
    engine.planner.cost_curve = curve
    return model, engine


def steps_padded(engine: LookaheadEngine, padded: bool) -> None:
    """Run ``engine``'s batched steps padded, as on a GPU or for sliding-window models, where
    ``padded`` (on a CPU they are packed wherever the probe allows)."""
    if padded:  # (the probe's answer, overridden)
        runner = engine.runner
        padding = replace(runner.backend, batch_layout="padded")
        runner.use(padding, layers=runner.linear.layers, direct=runner.direct)


def batched_forward(runner: ModelRunner) -> str:
    """The runner's method that runs the engine's batched steps."""
    return "forward_packed" if runner.packs() else "forward_batch"


def record_steps(engine: LookaheadEngine, watched: list[int]) -> list[tuple[int, int, int]]:
    """After each batched forward: the rows, the first row's tokens so far, and how much of
    the ``watched`` prompt is prefilled (0 before it joins the batch)."""
    scheduler, log = engine.scheduler, []
    name = batched_forward(engine.runner)
    forward_batch = getattr(engine.runner, name)

    def logged(inputs, *args, **kwargs):
        logits = forward_batch(inputs, *args, **kwargs)
        joined = [c.prefilled for c in scheduler._rows.calls if c.prompt_ids == watched]
        log.append((len(args[1]), len(scheduler._rows.calls[0].ids), joined[0] if joined else 0))
        return logits

    setattr(engine.runner, name, logged)
    return log


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_joining_prompt_rides_in_the_running_rows_steps_with_the_same_output(family: str) -> None:
    """Where a wider forward costs the running rows nothing more (a flat curve, as on an idle
    GPU), a joining prompt is prefilled in their steps, straight into its own row."""
    from rag_lookahead.planning.costs import CostCurve

    model, engine = joining_engine(CostCurve.flat(), family=family)
    alone: list[int] = []
    forward = engine.runner.forward

    def counting(input_ids, *args, **kwargs):
        if kwargs.get("last_only"):  # a prompt's forward (else a step of a call alone)
            alone.append(input_ids.shape[1])
        return forward(input_ids, *args, **kwargs)

    engine.runner.forward = counting  # type: ignore[method-assign]
    long_prompt = [(7 * i) % VOCAB for i in range(45)]
    log = record_steps(engine, long_prompt)
    first = engine.stream([3, 14, 15], max_new_tokens=40)
    next(first.chunks())  # decoding
    second = engine.stream(long_prompt, max_new_tokens=12)  # joins while the first decodes
    outputs = [first.complete(), second.complete()]
    assert outputs[0].token_ids == greedy_reference(model, [3, 14, 15], 40)
    assert outputs[1].token_ids == greedy_reference(model, long_prompt, 12)
    assert alone == [3]  # only the first prompt, before anybody else ran, went alone
    joined = next(i for i, (_, _, prefilled) in enumerate(log) if prefilled == 45)
    joining = [(tokens, prefilled) for rows, tokens, prefilled in log[: joined + 1] if rows == 2]
    # Each step of the join took a chunk (at least 4 tokens: 8 a forward over 2 rows, more
    # where the running row's draft is wider) and a step of the running row, which released
    # tokens at every one of them (the last chunk: what was left of the prompt).
    steps = list(itertools.pairwise(joining))
    assert len(steps) >= 5
    assert all(b[1] - a[1] >= min(4, 45 - a[1]) and b[0] > a[0] for a, b in steps)


@pytest.mark.parametrize(("budget", "per_step"), [(1, 1), (16, 2), (2048, 6)])
def test_a_join_that_would_widen_every_row_is_prefilled_apart_between_their_steps(
    budget: int, per_step: int
) -> None:
    """Where a wider forward costs (a CPU), the prompt goes apart, in the chunks that prefill
    the most of it per second, as many between two steps of the running row as the step's
    prefill budget lets in."""
    from rag_lookahead.planning.costs import CostCurve

    knee = CostCurve((1, 8, 64), (1.0, 2.0, 200.0))  # dearer per token past 8
    model, engine = joining_engine(knee, max_tokens_per_forward=64, max_prefill_tokens_per_step=budget)
    chunks: list[tuple[int, int]] = []
    forward = engine.runner.forward
    first = engine.stream([3, 14, 15], max_new_tokens=40)
    next(first.chunks())
    scheduler = engine.scheduler

    def counting(input_ids, *args, **kwargs):
        if kwargs.get("last_only"):
            chunks.append((input_ids.shape[1], len(scheduler._rows.calls[0].ids)))
        return forward(input_ids, *args, **kwargs)

    engine.runner.forward = counting  # type: ignore[method-assign]
    long_prompt = [(7 * i) % VOCAB for i in range(45)]
    second = engine.stream(long_prompt, max_new_tokens=12)
    outputs = [first.complete(), second.complete()]
    assert outputs[0].token_ids == greedy_reference(model, [3, 14, 15], 40)
    assert outputs[1].token_ids == greedy_reference(model, long_prompt, 12)
    assert [size for size, _ in chunks] == [8, 8, 8, 8, 8, 5]  # the most prompt per second
    ran = [tokens for _, tokens in chunks]  # the running row's tokens at each chunk
    groups = [(tokens, len(list(group))) for tokens, group in itertools.groupby(ran)]
    assert [count for _, count in groups] == [per_step] * (6 // per_step)
    assert all(a < b for (a, _), (b, _) in itertools.pairwise(groups))  # it stepped in between


def test_a_join_whose_steps_run_dear_goes_on_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch costs are measured a few tokens wide: a join priced from them may ride in the
    running rows' steps and turn out dear. Its steps are timed into the calibration, so the
    rest of its prompt goes on apart, from a copy of its row, and so does the next join."""
    import types

    from rag_lookahead.engine import executor as batch_forward
    from rag_lookahead.planning.costs import CostCurve

    model, engine = joining_engine(CostCurve.flat(), max_tokens_per_forward=64)
    scheduler, clock = engine.scheduler, [0.0]
    monkeypatch.setattr(batch_forward, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    name = batched_forward(engine.runner)
    forward_batch, forward, alone = getattr(engine.runner, name), engine.runner.forward, []

    def timed(inputs, *args, **kwargs):  # a step with a prompt's chunk in it: 100x its price
        clock[0] += 100.0 if any(c.prefilled < len(c.prompt_ids) for c in scheduler._rows.calls) else 1.0
        return forward_batch(inputs, *args, **kwargs)

    def counting(input_ids, *args, **kwargs):
        if kwargs.get("last_only"):
            alone.append(input_ids.shape[1])
        return forward(input_ids, *args, **kwargs)

    setattr(engine.runner, name, timed)
    engine.runner.forward = counting  # type: ignore[method-assign]
    prompts = [[(7 * i) % VOCAB for i in range(45)], [(5 * i + 4) % VOCAB for i in range(45)]]
    first = engine.stream([3, 14, 15], max_new_tokens=80)
    next(first.chunks())
    second = engine.stream(prompts[0], max_new_tokens=6)  # priced cheap: rides in a step
    assert second.complete().token_ids == greedy_reference(model, prompts[0], 6)
    third = engine.stream(prompts[1], max_new_tokens=6)  # priced as the second's steps ran
    assert third.complete().token_ids == greedy_reference(model, prompts[1], 6)
    assert first.complete().token_ids == greedy_reference(model, [3, 14, 15], 80)
    # The first prompt alone; the second's last 13 tokens apart, after a step of 32 (the
    # batch's 64 over its 2 rows) turned out dear; the third apart from the start.
    assert alone == [3, 13, 45]


@settings(max_examples=10, deadline=None)
@given(
    family=st.sampled_from(FAMILIES),
    seed=st.integers(0, 10_000),
    calls=st.integers(2, 5),
    stagger=st.integers(0, 3),
    budget=st.sampled_from([4, 9, 24]),
    packed=st.booleans(),
)
def test_calls_joining_in_the_running_steps_give_each_its_own_greedy_output(
    family, seed, calls, stagger, budget, packed
) -> None:
    """Prompts prefilled in the running rows' steps (a flat curve), from a kept prefix or
    not, several at once, with drafts beside them: each output is the greedy one."""
    from rag_lookahead.planning.costs import CostCurve

    rng = random.Random(seed)
    model = tiny_model(family)
    config = LookaheadConfig(mode="trie", min_query_length=1, max_batch_size=4, max_tokens_per_forward=budget)
    engine = LookaheadEngine(model, CharTokenizer(), config)
    steps_padded(engine, not packed)
    engine.planner.cost_curve = CostCurve.flat()
    assert_each_greedy(model, engine, random_jobs(rng, calls, shortest=1), stagger)


def test_a_prompt_prefilled_in_the_steps_is_kept_for_the_next_prompt_like_it() -> None:
    from rag_lookahead.planning.costs import CostCurve

    model, engine = joining_engine(CostCurve.flat())
    system = [(5 * i) % 90 + 4 for i in range(30)]  # nothing in common with the first
    log = record_steps(engine, [*system, 1, 2])
    first = engine.stream([3, 14, 15], max_new_tokens=60)
    next(first.chunks())
    second = engine.stream([*system, 1, 2], max_new_tokens=8)  # rides in the first's steps
    assert second.complete().token_ids == greedy_reference(model, [*system, 1, 2], 8)
    assert second.stats.cached_prompt_tokens == 0
    assert any(0 < prefilled < 32 for _, _, prefilled in log)  # it was a row while prefilling
    third = engine.stream([*system, 7], max_new_tokens=8)  # starts from the second's row
    assert third.complete().token_ids == greedy_reference(model, [*system, 7], 8)
    assert third.stats.cached_prompt_tokens == 30
    assert first.complete().token_ids == greedy_reference(model, [3, 14, 15], 60)


def test_a_call_closed_while_its_prompt_rides_in_the_steps_leaves_the_others_exact() -> None:
    from rag_lookahead.planning.costs import CostCurve

    model, engine = joining_engine(CostCurve.flat())
    long_prompt = [(7 * i) % VOCAB for i in range(45)]
    log = record_steps(engine, long_prompt)
    assert engine.tree_verification  # probed before the test steps the loop itself
    with engine.runner.thread.held():
        first = engine.stream([3, 14, 15], max_new_tokens=40)
        while first.stats.new_tokens == 0:
            engine.scheduler.iterate()
        second = engine.stream(long_prompt, max_new_tokens=12)
        while not any(0 < prefilled < 45 for _, _, prefilled in log):
            engine.scheduler.iterate()
        second.close()
    assert second.stats.finish_reason == "abandoned"
    assert first.complete().token_ids == greedy_reference(model, [3, 14, 15], 40)
    assert engine.scheduler._rows.calls == []


def test_a_prompt_left_alone_in_the_steps_is_forwarded_and_counted_as_a_prompt() -> None:
    """A prompt riding in the steps whose running rows all leave goes on alone, all of its
    rest at once; that forward counts among the prompts' (`Scheduler.prompt_forwards`), the
    chunks it rode in the steps do not."""
    from rag_lookahead.planning.costs import CostCurve

    model, engine = joining_engine(CostCurve.flat())
    long_prompt = [(7 * i) % VOCAB for i in range(45)]
    scheduler = engine.scheduler
    assert engine.tree_verification  # probed before the test steps the loop itself

    def riding() -> int:
        return next((c.prefilled for c in scheduler._rows.calls if c.prompt_ids == long_prompt), 0)

    with engine.runner.thread.held():
        first = engine.stream([3, 14, 15], max_new_tokens=40)
        while first.stats.new_tokens == 0:
            scheduler.iterate()
        second = engine.stream(long_prompt, max_new_tokens=12)
        while not 0 < riding() < 45:
            scheduler.iterate()
        prefilled = riding()
        first.close()  # the running row leaves; the prompt has the steps to itself
    assert second.complete().token_ids == greedy_reference(model, long_prompt, 12)
    counted = scheduler.prompt_forwards
    assert (counted.forwards, counted.tokens) == (2, 3 + 45 - prefilled)


def test_a_row_copied_out_of_the_batch_holds_its_tokens_and_outlives_the_row() -> None:
    runner = ModelTuning(tiny_model("llama")).runner
    prompts = ([3, 14, 15, 9], [2, 7, 1])
    batch = BatchCache()
    for prompt in prompts:
        batch.add_row(prefilled(runner, prompt))
    copy = batch.row_copy(1)
    alone = prefilled(runner, list(prompts[1]))
    batch.keep_rows([0])  # the row leaves, and another takes its place in the buffers
    batch.add_row(prefilled(runner, [5, 6, 7, 8, 9, 10]))
    for mine, its in zip(copy.layers, alone.layers, strict=True):
        torch.testing.assert_close(mine.keys, its.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mine.values, its.values, rtol=1e-5, atol=1e-5)
    logits, _ = runner.forward(torch.tensor([[4]]), copy)  # it goes on as the row would have
    expected, _ = runner.forward(torch.tensor([[4]]), alone)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("projects", [True, False])
def test_a_batched_forward_keeps_the_logits_asked_for_only(projects: bool) -> None:
    """``keep``: the model projects those positions alone, or (a model without
    ``logits_to_keep``) they are picked from all of them; the same logits either way."""
    runner = ModelTuning(tiny_model("llama")).runner
    batch = BatchCache()
    for prompt in ([3, 14, 15, 9], [2, 7, 1]):
        batch.add_row(prefilled(runner, prompt))
    drafts = [StepDraft(TREE), StepDraft(DraftTree((1, 2, 3), (-1, 0, 1)))]
    batch.prepare()
    inputs = batch_inputs(drafts, batch.lengths, runner.device, torch.float32)
    every = runner.forward_batch(inputs, batch.cache, batch.lengths)  # [2, 4, V]
    runner._logits_to_keep = projects
    batch.prepare()
    kept = runner.forward_batch(inputs, batch.cache, batch.lengths, keep=[0, 2])
    torch.testing.assert_close(kept, every[:, [0, 2]], rtol=1e-4, atol=1e-4)


def test_leaving_rows_are_filled_from_the_end_each_row_copied_at_most_once() -> None:
    runner = ModelTuning(tiny_model("llama")).runner
    prompts = [[3, 14, 15, 9], [2, 7, 1], [5, 5, 6], [8, 1, 8, 1, 2], [9, 9]]
    batch = BatchCache()
    for prompt in prompts:
        batch.add_row(prefilled(runner, prompt))
    order = batch.keep_rows([1, 3, 4])  # rows 0 and 2 left: 3 and 4 move into their places
    assert order == [3, 1, 4] and batch.lengths == [5, 3, 2]
    for target, source in enumerate(order):
        expected = prefilled(runner, prompts[source])
        length = len(prompts[source])
        for layer, alone in zip(batch.cache.layers, expected.layers, strict=True):
            torch.testing.assert_close(
                layer.key_buffer[target, :, :length], alone.keys[0], rtol=1e-4, atol=1e-4
            )
            torch.testing.assert_close(
                layer.value_buffer[target, :, :length], alone.values[0], rtol=1e-4, atol=1e-4
            )
    assert batch.keep_rows([0, 1, 2]) == [0, 1, 2]  # nobody left: nothing moves


def test_a_wide_batch_is_never_priced_below_its_tokens_forwarded_alone() -> None:
    """Batch curves are measured a few tokens wide; a joining prompt's chunk widens every row
    far past that, where the extrapolated curve alone would price the step too low."""
    from rag_lookahead.engine.pricing import Pricing
    from rag_lookahead.planning.costs import BatchCosts, CostCurve, CostModel

    costs = CostModel(
        CostCurve((1, 2, 4), (1.0, 1.1, 1.2)), BatchCosts(((2, CostCurve((1, 2, 4), (1.5, 1.5, 1.5))),))
    )
    pricing = Pricing(costs, 256)
    cost, alone = pricing.step_seconds, pricing.prefill_seconds
    assert cost(2, 1) == pytest.approx(1.5)  # narrow: the batch curve as measured
    assert alone(64) > 1.5
    assert cost(2, 32) == pytest.approx(alone(64))  # wide: at least its 64 tokens alone


def test_a_wider_batch_step_is_never_planned_as_cheaper_than_a_narrower_one() -> None:
    """Each width class is calibrated apart: a wider class timed lower than a narrower one must
    not make drafting wider look like a saving."""
    from rag_lookahead.engine.pricing import Pricing
    from rag_lookahead.planning.costs import BatchCosts, CostCurve, CostModel

    def linear(rows: int, width: int) -> float:
        return 1.0 + 0.1 * rows * width

    widths = tuple(range(1, 13))
    batch = BatchCosts(((4, CostCurve(widths, tuple(linear(4, w) for w in widths))),))
    pricing = Pricing(CostModel(CostCurve((1, 2), (1.0, 1.1)), batch), 256)
    pricing.calibration.record(4, 5, linear(4, 5), 3 * linear(4, 5))  # widths 4-7: 3x dearer
    seconds = pricing._by_width(4, 12)
    assert seconds(7) == pytest.approx(3 * linear(4, 7))
    assert seconds(8) == pytest.approx(3 * linear(4, 8))  # (8-15 take the nearest class seen)
    pricing.calibration.record(4, 8, linear(4, 8), linear(4, 8))  # widths 8-15: as measured
    seconds = pricing._by_width(4, 12)
    assert [seconds(w) for w in (7, 8, 12)] == [pytest.approx(3 * linear(4, 7))] * 3
    assert all(seconds(w) <= seconds(w + 1) for w in range(1, 12))


def test_a_packed_step_is_priced_by_its_tokens_and_calibrated_per_row() -> None:
    """Packed, a step of 4 rows and 6 tokens costs what 1.5 tokens a row cost (between the
    calibrated widths 1 and 2), and its timing calibrates the class of 2 tokens a row."""
    from rag_lookahead.engine.pricing import Pricing
    from rag_lookahead.engine.step import RowPlan, StepPlan
    from rag_lookahead.planning.costs import BatchCosts, CostCurve, CostModel

    widths = tuple(range(1, 9))
    batch = BatchCosts(((4, CostCurve(widths, tuple(1.0 + 0.1 * w for w in widths))),))
    pricing = Pricing(CostModel(CostCurve((1, 2), (1.0, 1.1)), batch), 256, lambda: True)
    by_tokens = pricing._by_tokens(4, 16)
    assert by_tokens(4) == pytest.approx(1.1) and by_tokens(6) == pytest.approx(1.15)
    assert by_tokens(8) == pytest.approx(1.2)
    rows = [RowPlan(StepDraft(DraftTree.root_only(7)))] * 2 + [RowPlan(StepDraft(TREE))] * 2
    pricing.observe(StepPlan(tuple(rows)), 2 * 1.6, 0)  # 10 tokens: 2.5 a row, priced 1.25
    assert pricing.width == 3
    assert pricing.calibration.factor(4, 3) == pytest.approx(3.2 / 1.25)
    assert pricing._by_tokens(4, 16)(12) == pytest.approx(1.3 * 3.2 / 1.25)


def test_a_longer_chunk_alone_is_never_priced_below_a_shorter_one() -> None:
    """The prompts' chunks calibrate each class of sizes apart: one slow short chunk must not
    price it above every longer one (a join would then look free beside it)."""
    from rag_lookahead.engine.pricing import Pricing
    from rag_lookahead.planning.costs import Calibration, CostCurve, CostModel

    assert Calibration.class_ends(231, 30) == [31, 63, 127, 231]
    assert Calibration.class_ends(33) == [1, 3, 7, 15, 31, 33]
    assert Calibration.class_ends(7, 4) == [7] and Calibration.class_ends(8, 4) == [7, 8]
    pricing = Pricing(CostModel(CostCurve((1, 2, 4), (1.0, 1.1, 1.2))), 256)
    pricing.observe_prompt(40, 1.2 + 5 * 36 * 0.05)  # 32-63 tokens: 5x the curve
    pricing.observe_prompt(200, 1.2 + 0.5 * 196 * 0.05)  # 128-255: half of it
    alone = pricing.prefill_seconds
    assert alone(63) == pytest.approx(1.2 + 5 * 59 * 0.05)
    assert alone(200) == alone(63) and alone(255) == alone(63)
    sizes = range(1, 300)
    assert all(alone(n) <= alone(n + 1) for n in sizes)


def test_a_chunk_apart_is_sized_on_the_measured_curve_not_on_a_class_timed_slow() -> None:
    """Each class of chunk sizes learns its own ratio: one timed in a slow moment must not
    make the scheduler cut prompts into smaller chunks (dearer per token, and more steps
    before the call decodes)."""
    from rag_lookahead.engine.pricing import Pricing
    from rag_lookahead.planning.costs import CostCurve, CostModel

    pricing = Pricing(CostModel(CostCurve((1, 2, 4), (1.0, 1.1, 1.2))), 256)
    assert pricing.prefill_chunk(1000, 4) == 256
    pricing.observe_prompt(100, 1.2 + 96 * 0.05)  # 64-127 tokens: as the curve says
    pricing.observe_prompt(200, 1.2 + 4 * 196 * 0.05)  # 128-255 tokens: 4x the curve
    pricing.observe_prompt(256, 1.2 + 4 * 252 * 0.05)  # 256-511 tokens: 4x the curve
    alone = pricing.prefill_seconds
    assert 127 / alone(127) > 256 / alone(256)  # calibrated: 127 pays best
    assert pricing.prefill_chunk(1000, 4) == 256
    assert pricing.prefill_chunk(90, 4) == 90  # the rest of a prompt


def test_a_lone_call_s_draft_fits_max_tokens_per_forward() -> None:
    from rag_lookahead.engine.observe import StepLog, observe_steps

    model = tiny_model("llama")
    config = LookaheadConfig(mode="trie", min_query_length=1, max_tokens_per_forward=6, max_batch_size=2)
    engine = LookaheadEngine(model, CharTokenizer(), config)
    prompt = [3, 14, 15]
    answer = greedy_reference(model, prompt, 24)
    engine.complete(prompt, max_new_tokens=24)  # its answer in the trie: long drafts next time
    with observe_steps(StepLog()) as log:
        again = engine.complete(prompt, max_new_tokens=24)
    assert again.token_ids == answer
    assert max(step.tokens for step in log.steps) == 6  # decoding_length (16) cut to fit
