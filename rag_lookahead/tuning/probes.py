"""What the engine checks by running the model, never assumes: whether it verifies draft
trees, whether its direct forward is its own bit for bit, whether packed batch rows give the
padded rows' logits. Each probe runs on runners of its own (`trial_runner`); any failure means
the plainer way, never a crash.

A model that ignores a custom 4-D mask (or, with sliding-window layers, one mask per layer
type), rejects explicit position ids, or builds a cache that cannot be rolled back would give
wrong tokens silently; the tree probe compares a small tree forward with plain causal forwards
of the same paths and reports the first problem it finds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.direct import DirectForward
from rag_lookahead.runtime.kernels import OneDnnLayers
from rag_lookahead.runtime.kv_cache import new_tree_cache, supports_tree
from rag_lookahead.runtime.layer_masks import LayerMasks
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.runtime.threads import ModelThread
from rag_lookahead.tuning.trials import dtype_tolerance, trial_runner

__all__ = ["direct_matches", "packed_rows_match", "training_problem", "tree_support_problem"]


def tree_support_problem(model: Any, cache_arg: str, masks: LayerMasks) -> str | None:
    """``None`` when the model verifies trees exactly, else what is wrong. With sliding layers
    the prompt outgrows their window, so that the window's cut is checked too."""
    if masks.unsupported:
        return f"it has layers whose attention a tree mask cannot express ({', '.join(masks.unsupported)})"
    vocab = int(model.config.vocab_size)
    prompt = [(7 * i + 3) % vocab for i in range(6 + (masks.window or 0))]
    a, b, c = (prompt[-1] + 1) % vocab, (prompt[-1] + 2) % vocab, (prompt[-1] + 3) % vocab
    # Root, then a sibling the others must not see, then a two-token branch.
    tree = DraftTree((prompt[-1], a, b, c), (-1, 0, 0, 2))
    device = next(model.parameters()).device
    try:
        with torch.inference_mode():
            cache = new_tree_cache()
            model(input_ids=torch.tensor([prompt[:-1]], device=device), use_cache=True, **{cache_arg: cache})
            if not supports_tree(cache):
                return f"its cache ({type(cache).__name__}) cannot be rolled back"
            inputs = tree.inputs(len(prompt) - 1, device, model.dtype)
            got = (
                model(
                    input_ids=inputs.input_ids,
                    position_ids=inputs.position_ids,
                    attention_mask=masks(inputs, [len(prompt) - 1]),
                    use_cache=True,
                    **{cache_arg: cache},
                )
                .logits[0]
                .float()
            )
            want = model(input_ids=torch.tensor([[*prompt, b, c]], device=device)).logits[0].float()
    except Exception as err:  # any failure means "no tree verification", never a crash
        return f"a tree forward failed: {type(err).__name__}: {err}"
    want = want[[-3, -2, -1]]  # root, b, c
    got = got[[0, 2, 3]]
    tolerance = dtype_tolerance(model)
    error = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
    if error > tolerance:
        return f"a custom 4-D attention mask changed its logits (relative error {error:.2g})"
    return None


def training_problem(model: Any) -> str | None:
    """Why a model in training mode decodes plainly: as `generate` would, each forward with its
    dropout drawn anew where it has some (a draft's verification would draw other masks)."""
    if not any(module.training for module in model.modules()):
        return None
    return (
        "it is in training mode (model.train(), or a module added in its default training "
        "mode), where dropout draws anew at every forward: call model.eval() to draft again"
    )


def direct_matches(
    model: Any,
    thread: ModelThread,
    direct: DirectForward,
    linear: tuple[tuple[int, str], ...],
    layers: OneDnnLayers | None,
) -> bool:
    """Whether the model's ``direct`` forward gives its own forward's logits and cache entries
    bit for bit on the ``linear`` kernels, through the runner's paths: a prompt, one token after
    it, a draft tree under its mask, and a batch of two rows (else the model's own runs)."""
    try:
        want = _probe_outputs(trial_runner(model, thread, linear=linear, layers=layers))
        got = _probe_outputs(trial_runner(model, thread, linear=linear, layers=layers, direct=direct))
    except Exception:  # any failure means "the model's own forward", never a crash
        return False
    return len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def _probe_outputs(runner: ModelRunner) -> list[torch.Tensor]:
    """The logits and cache entries of the direct forward's probe (`direct_matches`)."""
    vocab, device = int(runner.model.config.vocab_size), runner.device
    outputs: list[torch.Tensor] = []
    prompt = torch.tensor([[(7 * i + 3) % vocab for i in range(6)]])
    logits, cache = runner.forward(prompt, None)
    outputs.append(logits)
    logits, cache = runner.forward(torch.tensor([[5 % vocab]]), cache)
    outputs += [logits, *_entries(cache)]
    drafts = _probe_drafts(vocab)
    _, grown = runner.forward(prompt, new_tree_cache(), last_only=True)
    logits, grown = runner.forward_step(drafts[0], grown, prompt.shape[1])
    outputs += [logits, *_entries(grown)]
    batch = _probe_batch(lambda ids: runner.forward(ids, new_tree_cache())[1], (5, 9), vocab, device)
    batch.prepare()
    inputs = batch_inputs(drafts, batch.lengths, device, runner.model.dtype)
    outputs += [runner.forward_batch(inputs, batch.cache, batch.lengths, keep=[0, 2]), *_entries(batch.cache)]
    return outputs


def _entries(cache: Any) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def _probe_drafts(vocab: int) -> list[StepDraft]:
    """The batch probes' step: a tree of two branches on one row, a single token on the other."""
    return [
        StepDraft(DraftTree(tuple(i % vocab for i in (11, 12, 13, 14)), (-1, 0, 0, 2))),
        StepDraft(DraftTree((15 % vocab,), (-1,))),
    ]


def _probe_batch(
    prefill: Callable[[torch.Tensor], Any],
    lengths: Sequence[int],
    vocab: int,
    device: torch.device,
    packed: bool = False,
) -> BatchCache:
    """A batch (``packed`` or padded) of rows of ``lengths`` made-up tokens, each row's cache
    made by ``prefill`` from its prompt ``[1, T]``."""
    batch = BatchCache(packed=packed)
    for length in lengths:
        prompt = torch.tensor([[(7 * i + 3) % vocab for i in range(length)]], device=device)
        batch.add_row(prefill(prompt), expected_rows=len(lengths))
    return batch


def packed_rows_match(
    model: Any,
    thread: ModelThread,
    linear: tuple[tuple[int, str], ...],
    layers: OneDnnLayers | None,
    direct: DirectForward | None,
) -> bool:
    """Whether a packed forward of two rows (a tree after 5 cached tokens, one token after 9,
    each past the sliding window if the model has one) gives the padded forward's logits, on
    the forwards the engine will run (the ``linear`` kernels, ``direct`` where given): a model
    that reads its keys' or mask's shapes in its own way, or attends with something the packed
    rows cannot express, fails it."""
    vocab = int(model.config.vocab_size)
    drafts = _probe_drafts(vocab)

    @torch.inference_mode()
    def prefill(prompt: torch.Tensor) -> Any:
        cache = new_tree_cache()
        model(input_ids=prompt, use_cache=True, **{runner.cache_arg: cache})
        return cache

    try:
        runner = trial_runner(
            model, thread, linear=linear, layers=layers, direct=direct, batch_layout="packed"
        )
        past = runner.layer_masks.window or 0  # the rows outgrow a sliding window: it is cut
        lengths = (5 + past, 9 + past)
        padded = _probe_batch(prefill, lengths, vocab, runner.device)
        packed = _probe_batch(prefill, lengths, vocab, runner.device, packed=True)
        padded.prepare()
        inputs = batch_inputs(drafts, padded.lengths, runner.device, model.dtype)
        want = runner.forward_batch(inputs, padded.cache, padded.lengths).float()  # [2, 4, V]
        want = torch.cat([want[0], want[1, :1]])  # [5, V]
        side_by_side = runner.packed_inputs(drafts, packed.lengths)
        packed.prepare(side_by_side)
        got = runner.forward_packed(side_by_side, packed.cache, packed.lengths).float()  # [5, V]
    except Exception:  # any failure means "padded steps", never a crash
        return False
    tolerance = dtype_tolerance(model)
    return bool((got - want).abs().max().item() <= tolerance * max(want.abs().max().item(), 1e-6))
