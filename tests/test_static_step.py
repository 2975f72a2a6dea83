"""The static-shape step (`rag_lookahead.runtime.static`): fixed buckets, slot caches written in
place, persistent inputs, padding that nothing real sees, the accepted path moved by index
copies; on a CPU everything but the capture call, whose cases below run on a CUDA device
(``benchmarks/cuda/captured.sh`` runs them there). Every answer of the engine on a static step
equals plain greedy `generate`, on every family the property tests cover, sliding windows
included, whatever its drafts and its buckets."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting.protocol import Drafter
from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.drafting.trie_drafter import TrieDrafter
from rag_lookahead.runtime.backend import Backend
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.runtime.static import (
    Bucket,
    Buckets,
    SlotCache,
    StaticStep,
    capture_problem,
    prompt_entries,
)
from rag_lookahead.testing import CharTokenizer, read_all, tiny_model
from rag_lookahead.testing.models import FAMILIES, SLIDING_FAMILIES, VOCAB, greedy_reference, sliding_model
from rag_lookahead.tuning.step_choice import StepSettings

PROMPTS = (
    [3, 14, 15, 9, 26, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6],
    [2, 7, 1, 8, 2, 8],
    [1, 4, 1, 4, 2, 1, 3, 5, 6],
)
NEW = 24
SMALL = Buckets(rows=(1, 2), widths=(1, 4, 8))


class _Oracle:
    """Drafts from the known greedy answer: a wrong branch first, then ``right`` correct
    tokens (so the accepted path is not the tree's first nodes and must be moved); every
    third step only wrong tokens."""

    def __init__(self, prompt: Sequence[int], answer: Sequence[int], right: int) -> None:
        self.prompt, self.answer, self.right = len(prompt), list(answer), right
        self.steps = 0

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        self.steps += 1
        done = len(context) - self.prompt  # emitted; the root is the last of them
        upcoming = self.answer[done : done + self.right]
        wrong = [(t + 1) % VOCAB for t in upcoming[:2]] or [(context[-1] + 1) % VOCAB]
        tokens, parents = list(wrong), [-1, *range(len(wrong) - 1)]
        if self.steps % 3:
            parents += [-1, *(len(tokens) + i for i in range(len(upcoming) - 1))]
            tokens += upcoming
        return StepDraft(DraftTree.from_draft(context[-1], tokens[:budget], parents[:budget], "oracle"))

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        pass

    def close(self) -> None:
        pass


_SLIDING = {f"{f}-window" for f in SLIDING_FAMILIES}
ALL = [*FAMILIES, *sorted(_SLIDING)]


def _load(family: str) -> Any:
    return sliding_model(family.removesuffix("-window")) if family in _SLIDING else tiny_model(family)


def _answers(model: Any, new: int = NEW, prompts: Sequence[Sequence[int]] = PROMPTS) -> list[list[int]]:
    """Greedy `generate`'s answers, on the model's device."""
    device = next(model.parameters()).device
    answers = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], device=device)
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False
            )
            answers.append(out[0, len(prompt) :].tolist())
    return answers


def static_engine(
    model: Any, buckets: Buckets = SMALL, step: str = "static", max_len: int = 96, **config: Any
) -> LookaheadEngine:
    """An engine whose batch runs on a static step of ``buckets`` (rows as many as its batch)."""
    settings = {"mode": "trie", "min_query_length": 1, "max_batch_size": buckets.most_rows, **config}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StepSettings, "buckets", lambda self: buckets)
        return LookaheadEngine(
            model,
            CharTokenizer(),
            LookaheadConfig(step=step, max_model_len=max_len, **settings),  # type: ignore[arg-type]
        )


def decoded(
    engine: LookaheadEngine,
    drafters: Callable[[int, Sequence[int]], Drafter] | None = None,
    prompts: Sequence[Sequence[int]] = PROMPTS,
    new: int = NEW,
) -> tuple[list[list[int]], int]:
    """Each prompt's answer, all decoding together (``drafters(i, prompt)``: call ``i``'s own
    drafter), and the steps all of them took."""
    params = GenerationParams(max_new_tokens=new)
    streams = [
        engine.stream(list(p), params, drafter=drafters(i, p) if drafters else None)
        for i, p in enumerate(prompts)
    ]
    results = read_all(streams)
    done = [r for r in results if not isinstance(r, Exception)]
    assert len(done) == len(results), results
    return [d.token_ids for d in done], sum(d.stats.steps for d in done)


def replayed(engine: LookaheadEngine) -> set[Bucket]:
    static = engine.runner.static
    assert static is not None
    return {bucket for bucket, buffers in static._buffers.items() if buffers.replays}


@pytest.mark.parametrize("family", ALL)
def test_static_greedy_equals_generate_plain_and_with_trees(family: str) -> None:
    model = _load(family)
    answers = _answers(model)
    plain = static_engine(model, mode="off")  # two rows for three prompts: one joins later
    tokens, plain_steps = decoded(plain)
    assert tokens == answers
    engine = static_engine(model)
    tokens, steps = decoded(engine, lambda i, p: _Oracle(p, answers[i], right=5))
    assert tokens == answers
    assert steps < plain_steps  # the trees were accepted
    assert {b.width for b in replayed(engine)} >= {4, 8}


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3-window", "qwen2-window"])
@pytest.mark.parametrize(
    "buckets", [Buckets(), Buckets(rows=(1, 4), widths=(1, 16)), Buckets(rows=(1,), widths=(1, 2))]
)
def test_trie_drafts_over_any_buckets_equal_generate(family: str, buckets: Buckets) -> None:
    model = _load(family)
    answers = _answers(model)
    trie = TokenTrie()

    def drafter(i: int, prompt: Sequence[int]) -> TrieDrafter:
        # The call's "document": its own answer with a slip in the middle (a wrong branch).
        document = [*prompt, *answers[i][:10], (answers[i][10] + 1) % VOCAB, *answers[i][11:]]
        return TrieDrafter(trie, f"call{i}", [document, [*prompt, *answers[i]]], min_match=1)

    tokens, steps = decoded(static_engine(model, buckets, max_len=128), drafter)
    assert tokens == answers
    assert steps < (NEW - 1) * len(PROMPTS)  # fewer forwards than plain decoding


def test_random_wrong_trees_never_change_the_answer() -> None:
    model = tiny_model("qwen2")
    answers = _answers(model)
    rng = random.Random(7)

    class Noise(_Oracle):
        def propose(self, context: Sequence[int], budget: int) -> StepDraft:
            tree = DraftTree.from_draft(context[-1], [], [], "noise")
            shape = [t % VOCAB for t in rng.sample(range(VOCAB), 1 + rng.randrange(min(budget, 30)))]
            noise = DraftTree.from_draft(
                context[-1], shape, [rng.randrange(-1, i) for i in range(len(shape))], "x"
            )
            return StepDraft(tree.merge(noise))

    tokens, _ = decoded(static_engine(model, Buckets()), lambda i, p: Noise(p, answers[i], 0))
    assert tokens == answers


def _runner(model: Any) -> ModelRunner:
    backend = Backend("cpu", "float32", "sdpa", ((1, "torch"),), "model", "padded", None)
    return ModelRunner(model, backend)


@pytest.mark.parametrize("family", ["llama", "gemma", "gpt2", "gemma3-window", "mistral-window"])
def test_static_logits_equal_the_eager_runners_for_the_same_trees(family: str) -> None:
    model = _load(family)
    runner = _runner(model)
    rng = random.Random(3)
    trees = [DraftTree((5, *rng.sample(range(VOCAB), 6)), (-1, 0, 1, 0, 3, 1, 2)), DraftTree((9, 2), (-1, 0))]
    step = StaticStep(model, 64, Buckets(rows=(1, 4), widths=(1, 8)))
    expected = []
    for slot, (prompt, tree) in enumerate(zip(PROMPTS, trees, strict=False)):
        cache = new_tree_cache()
        runner.forward(torch.tensor([prompt]), cache)
        step.load(slot, prompt_entries(cache))
        expected.append(runner.forward_step(StepDraft(tree), cache, len(prompt))[0])
    logits = step.run(trees, [len(p) for p in PROMPTS[:2]])  # bucket 4x8: two padding rows
    assert logits.shape[:2] == (4, 8)
    for row, want in enumerate(expected):
        torch.testing.assert_close(logits[row, : len(want)], want, rtol=1e-5, atol=1e-5)


def test_padding_changes_no_real_logit_and_is_never_accepted() -> None:
    model = tiny_model("llama")
    tree = DraftTree((5, 7, 8, 9), (-1, 0, 1, 0))
    snug = StaticStep(model, 64, Buckets(rows=(1,), widths=(1, 4)))
    padded = StaticStep(model, 64, Buckets(rows=(1, 8), widths=(1, 32)))
    cache = new_tree_cache()
    model(input_ids=torch.tensor([PROMPTS[0]]), cache=cache, use_cache=True)
    entries = prompt_entries(cache)
    snug.load(0, entries)
    padded.load(0, entries)
    length = len(PROMPTS[0])
    want = snug.run([tree], [length]).clone()
    got = padded.run([tree], [length])
    assert got.shape[:2] == (1, 32)
    torch.testing.assert_close(got[0, :4], want[0], rtol=1e-5, atol=1e-5)
    # Padding slots carry token 0 and the root's position: a drafted 0 would still be a
    # real node of its own, and the walk only follows the tree's children.
    assert all(tree.child(node, 0) is None for node in range(len(tree)))


def test_the_accepted_path_moves_to_the_next_columns_and_plain_paths_do_not_copy() -> None:
    cache = SlotCache(layers=1, slots=2, max_len=16, widest=4, device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="allocated"):
        cache.move(0, torch.tensor([3]), 2)
    step = StaticStep(tiny_model("llama"), 16, Buckets(rows=(1, 2), widths=(1, 4)))
    keys, _ = step.cache.rows()[0]
    with torch.inference_mode():
        keys[1, :, :, 0] = torch.arange(16.0)
    step.keep(1, 5, [0, 2, 3])  # nodes at columns 5, 7, 8 -> 5, 6, 7
    assert keys[1, 0, :9, 0].tolist() == [0, 1, 2, 3, 4, 5, 7, 8, 8]
    step.keep(1, 5, [0, 1])  # already in place
    assert keys[1, 0, :9, 0].tolist() == [0, 1, 2, 3, 4, 5, 7, 8, 8]


def test_buckets_are_validated_and_fit_each_step() -> None:
    buckets = Buckets()
    assert buckets.fit(3, 5) == Bucket(4, 8) and buckets.fit(1, 1) == Bucket(1, 1)
    assert buckets.all()[0] == Bucket(8, 32) and len(buckets.all()) == 20
    for bad in ({"rows": (2, 4)}, {"widths": (1, 8, 4)}, {"rows": ()}, {"widths": (1, 1)}):
        with pytest.raises(ValueError, match="ascend"):
            Buckets(**bad)
    with pytest.raises(ValueError, match="rows"):
        buckets.fit(9, 1)
    with pytest.raises(ValueError, match="slots"):
        buckets.fit(1, 33)


def test_a_step_that_cannot_fit_fails_clearly_and_a_cpu_model_is_not_captured() -> None:
    model = tiny_model("llama")
    step = StaticStep(model, 40, SMALL)
    with pytest.raises(ValueError, match="exceeds 40"):
        step.run([DraftTree((3, 4, 5, 6, 7), (-1, 0, 1, 2, 3))], [33])  # 33 + 8 slots > 40 columns
    with pytest.raises(ValueError, match="3 rows does not fit"):
        step.run([DraftTree.root_only(3)] * 3, [1, 2, 3])
    assert "CUDA" in (capture_problem(model) or "")
    step.capture()
    assert step.captured == () and "CUDA" in step.record.problems[0]
    assert not step.weights_moved()
    with pytest.raises(ValueError, match="attention"):
        StaticStep(_FlashConfigured(model), 32)
    with pytest.raises(ValueError, match="positions"):
        StaticStep(model, model.config.max_position_embeddings + 1)


def test_an_attention_set_without_tree_masks_is_refused_not_answered_wrong() -> None:
    model = copy.deepcopy(tiny_model("llama"))
    step = StaticStep(model, 40, SMALL)
    model.config._attn_implementation = "flash_attention_2"  # set after the step was built
    with pytest.raises(ValueError, match="takes no tree mask"):
        step.run([DraftTree.root_only(3)], [4])


def test_scratch_forwards_between_steps_leave_the_rows_alone() -> None:
    """Warm-ups, captures and timings may run between any two steps: they write only the
    scratch columns, which no committed entry reaches."""
    model, prompt = tiny_model("llama"), PROMPTS[0]
    answer = greedy_reference(model, prompt, NEW)
    step = StaticStep(model, len(prompt) + NEW + SMALL.widest, SMALL)
    cache = new_tree_cache()
    out = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
    step.load(0, prompt_entries(cache))
    tokens = [int(out.logits[0, -1].argmax())]
    length = len(prompt)
    while len(tokens) < NEW:
        for bucket in SMALL.all():  # every bucket's scratch forward, over the live row
            step.forward(step.fill_scratch(bucket))
        logits = step.run([DraftTree.root_only(tokens[-1])], [length])  # [R, W, V]
        tokens.append(int(logits[0, 0].argmax()))
        length += 1
    assert tokens == answer


def test_generation_stops_at_a_stop_token() -> None:
    model = tiny_model("llama")
    answer = greedy_reference(model, PROMPTS[1], NEW)
    stop = answer[5]
    engine = static_engine(model, max_len=64)
    with pytest.MonkeyPatch.context() as patch:  # (a stop token: the model's end of text)
        patch.setattr(engine._facts, "call_eos", lambda eos: (stop,))
        tokens = engine.complete(PROMPTS[1], max_new_tokens=NEW).token_ids
    assert tokens == answer[: answer.index(stop) + 1]


class _FlashConfigured:
    """A model whose config names flash-attention (a tree mask cannot reach it)."""

    def __init__(self, model: Any) -> None:
        self.config = type("Config", (), {"_attn_implementation": "flash_attention_2"})()
        self.parameters = model.parameters


def test_a_backend_names_its_step_kind_eager_by_default() -> None:
    backend = Backend("cpu", "float32", "sdpa", ((1, "torch"),), "model", "padded", None)
    assert backend.step == "eager" and backend.as_dict()["step"] == "eager" and "step" not in str(backend)
    static = Backend("cpu", "float32", "sdpa", ((1, "torch"),), "model", "padded", None, step="static")
    assert str(static).endswith("; step static")
    with pytest.raises(ValueError, match="CUDA"):
        Backend("cpu", "float32", "sdpa", ((1, "torch"),), "model", "padded", None, step="captured")
    with pytest.raises(ValueError, match="step"):
        Backend("cpu", "float32", "sdpa", ((1, "torch"),), "model", "padded", None, step="graph")  # type: ignore[arg-type]


# ------------------------------------------------------------------ on a CUDA device only
# (benchmarks/cuda/captured.sh runs these there, before its timings)

cuda_only = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="captures CUDA graphs: needs a CUDA device"
)


@cuda_only
@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3-window", "qwen2-window"])
def test_cuda_captured_buckets_answer_as_generate_and_replay_the_eager_logits(family: str) -> None:
    model = copy.deepcopy(_load(family)).to("cuda")
    answers = _answers(model)
    captured, eager = StaticStep(model, 96, SMALL), StaticStep(model, 96, SMALL)
    captured.capture()
    assert captured.record.problems == [] and set(captured.captured) == set(SMALL.all())
    tree = DraftTree((5, 7, 8, 9), (-1, 0, 1, 0))
    torch.testing.assert_close(
        captured.run([tree, tree], [10, 20]).clone(), eager.run([tree, tree], [10, 20]), rtol=0, atol=0
    )
    engine = static_engine(model, step="captured")
    assert engine.backend.step == "captured" and engine.backend.step_problem is None
    assert set(engine.runner.static.captured) == set(SMALL.all())  # type: ignore[union-attr]
    assert decoded(static_engine(model, step="captured", mode="off"))[0] == answers
    tokens, steps = decoded(engine, lambda i, p: _Oracle(p, answers[i], right=5))
    assert tokens == answers and steps < (NEW - 1) * len(PROMPTS)


@cuda_only
def test_cuda_a_hooked_model_is_not_captured_and_says_why() -> None:
    model = copy.deepcopy(tiny_model("llama")).to("cuda")
    model.model.layers[0].register_forward_hook(lambda *_: None)
    with pytest.warns(UserWarning, match="hooks"):
        engine = static_engine(model, step="captured", max_len=64)
    assert engine.backend.step == "eager" and "hooks" in (engine.backend.step_problem or "")
    assert decoded(engine, prompts=[PROMPTS[1]], new=8)[0] == _answers(model, 8, [PROMPTS[1]])
