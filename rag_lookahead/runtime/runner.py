"""The model's forward passes: the one place that runs the model.

The engine decides what to run; this module runs it over a KV cache — the prompt, a draft tree
(with the Jacobi window's rows, if any), or a chain of tokens timed for the cost curve.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import torch

from rag_lookahead.config import CpuLinear
from rag_lookahead.decoding.tree import DraftTree, PackedInputs, StepDraft, TreeInputs, packed_inputs
from rag_lookahead.planning.costs import (
    BatchCosts,
    CostCurve,
    CostModel,
    CurveCheck,
    StepCalibration,
    cached_curve,
    curve_key,
    forget_curve,
    measure_curve,
)
from rag_lookahead.planning.load import watch_load
from rag_lookahead.progress import progress_bar
from rag_lookahead.runtime.attention import (
    ATTENTION_NAME,
    attention_used,
    causal_chunk,
    grouped_attention,
    packed_rows,
    ragged_rows,
)
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.direct import DirectForward
from rag_lookahead.runtime.fingerprint import ModelState
from rag_lookahead.runtime.kernels import ForwardSeconds, LinearKernels, linear_used
from rag_lookahead.runtime.kv_cache import cache_kwarg, new_tree_cache
from rag_lookahead.runtime.layer_masks import LayerMasks
from rag_lookahead.runtime.memory import large_blocks_expected
from rag_lookahead.runtime.probe import tree_support_problem
from rag_lookahead.runtime.threads import ModelThread

__all__ = ["ModelRunner"]

# One forward: logits and cache of ``(input_ids, cache, position_ids=, attention_mask=,
# logits_to_keep=)`` (the model's own, or `DirectForward`).
Forward = Callable[..., Any]

# The context each row of a measured batch holds (a RAG prompt is longer; this keeps it quick).
_BATCH_CONTEXT = 256
# The prompt before the forwards that choose the linear kernels of a step (`_kernel_timer`).
_KERNEL_CONTEXT = 128


class ModelRunner:
    """Forward passes of one model, serialised by its own lock (engine variants share it) and
    run by a `ModelThread` (``thread``, or the process's shared one); on a CPU its fp32 linear layers
    run on the kernels ``linear`` chooses by a forward's tokens (`rag_lookahead.runtime.kernels`;
    ``"auto"``'s choice kept under ``cache_dir`` where given, for the next process).

    What it derives from the model (the direct forward, the reordered weights, the tree probe's
    verdict) is derived again after the model changed, as `refresh` finds at each call."""

    def __init__(
        self,
        model: Any,
        linear: CpuLinear = "auto",
        thread: ModelThread | None = None,
        direct: bool = True,
        cache_dir: Path | None = None,
    ) -> None:
        self.model = model
        self.thread = thread or ModelThread.shared()
        if self.device.type == "cpu":
            self.thread.call(large_blocks_expected)
        self.costs = CostModel()  # what its forwards cost, once measured (or given)
        self.lock = threading.RLock()
        self.cache_arg = cache_kwarg(model)
        self.layer_masks = LayerMasks.of(model.config)
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        # Changes of the model's structure seen (`refresh`), and the one the tree probe and the
        # direct forward were derived for.
        self._structure = 0
        self._probed: int | None = None
        self._derived = 0
        self._tree_problem: str | None = None
        self._packs = False  # probed with the trees
        self._wants_direct = direct
        self.direct: DirectForward | None = None
        self.linear = LinearKernels.one("torch")  # until chosen: what a kernel timer's prompt runs on
        timer = functools.partial(self._kernel_timer, direct)
        self.linear = self.thread.call(lambda: linear_used(model, self.device, linear, timer, cache_dir))
        self.direct = None  # (a kernel timer's, unprobed)
        if direct:  # probed on the kernels chosen: each forward runs on them
            self.direct = self.thread.call(lambda: _matching_direct(self))
        self._state = ModelState.of(model)
        self._state_lock = threading.Lock()
        self.generation = 0  # changes of the model seen: what was computed before one is stale

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextmanager
    def _running(self, tokens: int, locked: bool = True) -> Iterator[Forward]:
        """One forward of ``tokens`` tokens, by the function given: alone on the model
        (``locked``: the probe, in the model's thread, runs while a caller may hold the lock),
        without autograd, with the grouped attention and the linear kernel chosen for so many
        tokens on CPU; the direct forward where there is one and the model is still as it read
        it (`DirectForward.applies`), else the model's own."""
        direct = self.direct if self.direct is not None and self.direct.applies() else None
        with (
            self.lock if locked else contextlib.nullcontext(),
            torch.inference_mode(),
            grouped_attention(self.model, self.device),
            contextlib.nullcontext() if direct else self.linear.running(tokens),
        ):
            if direct is not None:
                yield functools.partial(direct, linear=self.linear.function(tokens))
            else:
                yield self._model_forward

    def _model_forward(
        self, input_ids: torch.Tensor, cache: Any, logits_to_keep: Any = None, **kwargs: Any
    ) -> Any:
        """The model's own forward, called as `DirectForward` is."""
        if logits_to_keep is not None:  # (given only where the model takes it)
            kwargs["logits_to_keep"] = logits_to_keep
        return self.model(input_ids=input_ids, use_cache=True, **{self.cache_arg: cache}, **kwargs)

    def _curve_key(self, max_tokens: int) -> dict[str, Any]:
        attention = str(attention_used(self.model, self.device))
        forward = "model" if self.direct is None else "direct"
        return curve_key(self.model, self.device, max_tokens, str(self.linear), attention, forward)

    def refresh(self, untracked: bool = False) -> int:
        """The model's changes seen so far (`generation`), after looking whether it changed
        since the last look (its `ModelState`: weights, modules, hooks, mode), once per call,
        in the caller's thread. After any change what was computed before it is stale (the
        schedulers drop their kept prompts when `generation` moves); after a change of its
        structure the direct forward, the linear layers' reordered copies and the tree probe
        are derived again, in the model's thread, before this returns. ``untracked``: the caller
        says the model changed where torch records nothing (a write through ``.data``), taken
        as a change of its structure."""
        state = ModelState.of(self.model)
        with self._state_lock:
            change = "structure" if untracked else state.change_from(self._state)
            self._state = state
            if change is not None:
                self.generation += 1
            if change == "structure":
                self._structure += 1
            generation = self.generation
        if change == "structure":
            self.tree_problem()  # probed again now, not in the middle of a step
        return generation

    def tree_problem(self) -> str | None:
        """Why this model cannot verify draft trees, or ``None``; probed once (and again after
        its structure changed: `refresh`), warned once each time.

        Once probed, the answer is read without waiting: every new call asks, and the probe's
        forwards run in the model's thread, behind the running batch's steps."""
        if self._probed == self._structure:
            return self._tree_problem
        problem, fresh = self.thread.call(self._probe)
        if fresh and problem is not None:
            warnings.warn(
                f"rag-lookahead: this model cannot verify draft trees ({problem}); "
                "decoding plainly, without lookahead. Outputs are unaffected.",
                stacklevel=5,
            )
        return problem

    def _probe(self) -> tuple[str | None, bool]:
        """The probe's answer, and whether it was probed now: in the model's thread, which
        runs one thing at a time, so it is probed once however many threads ask (and what
        depends on the model's modules is derived again first, where they changed)."""
        structure = self._structure  # (a change seen meanwhile has it probed again)
        if self._probed == structure:
            return self._tree_problem, False
        if self._derived != structure:
            self._derive_again()
            self._derived = structure
        self._tree_problem = _training_problem(self.model) or tree_support_problem(
            self.model, self.cache_arg, self.layer_masks
        )
        own = attention_used(self.model, self.device) == ATTENTION_NAME
        self._packs = own and self._tree_problem is None and _packed_matches(self)
        self._probed = structure
        return self._tree_problem, True

    def _derive_again(self) -> None:
        """After a change of the model's structure: its linear layers read again, with their
        reordered copies (a weight written through ``.data`` left no trace), and its direct
        forward probed again where none applies (built in training mode, or with a hook since
        removed: an earlier one is kept, as it applies again once the model is as it was)."""
        if self.linear.layers is not None:
            self.linear.layers.refresh(self.model)
        if self._wants_direct and (self.direct is None or not self.direct.applies()):
            self.direct = _matching_direct(self) or self.direct

    def forward(
        self, input_ids: torch.Tensor, cache: Any, last_only: bool = False, **kwargs: Any
    ) -> tuple[torch.Tensor, Any]:
        """Logits ``[n, V]`` for ``input_ids`` ``[1, n]``, and the cache now holding them.

        ``cache=None`` lets the model build the cache it prefers (plain decoding).
        """
        if last_only and self._logits_to_keep:
            kwargs["logits_to_keep"] = 1
        # Tokens in order after the cache, under the model's own causal mask: a prompt's chunk.
        tokens = input_ids.numel()
        chunk = input_ids.shape[-1] > 1 and not {"attention_mask", "position_ids"} & kwargs.keys()
        # Its attention multiplies on oneDNN where its linear layers do (the faster here).
        attending = causal_chunk(self.linear.kernel(tokens) != "torch") if chunk else contextlib.nullcontext()
        with self._running(tokens) as run, attending:
            out = run(input_ids.to(self.device), cache, **kwargs)
        if cache is None:
            cache = getattr(out, "cache", None)
            cache = cache if cache is not None else getattr(out, "past_key_values", None)
        return out.logits[0], cache

    def forward_batch(
        self, inputs: TreeInputs, cache: Any, lengths: Sequence[int], keep: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Logits ``[B, T, V]`` for batched step inputs (see `rag_lookahead.runtime.batch`)
        over rows of ``lengths`` cached tokens; with ``keep`` (ascending), only at those
        positions of every row, ``[B, len(keep), V]``."""
        return self._padded(inputs, cache, lengths, keep)

    def _padded(
        self,
        inputs: TreeInputs,
        cache: Any,
        lengths: Sequence[int],
        keep: Sequence[int] | None = None,
        locked: bool = True,
    ) -> torch.Tensor:
        width = inputs.input_ids.shape[1]
        rows = ragged_rows([length + width for length in lengths])
        mask = self.layer_masks(inputs, lengths)
        return self._step(inputs.input_ids, inputs.position_ids, mask, cache, keep, rows, locked)

    def forward_packed(
        self, inputs: PackedInputs, cache: Any, lengths: Sequence[int], keep: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Logits ``[N, V]`` for packed step inputs over rows of ``lengths`` cached tokens (see
        `rag_lookahead.runtime.batch`); with ``keep`` (ascending), only at those of the ``N``
        tokens, ``[len(keep), V]``. Only where `packs`."""
        return self._packed(inputs, cache, lengths, keep)

    def _packed(
        self,
        inputs: PackedInputs,
        cache: Any,
        lengths: Sequence[int],
        keep: Sequence[int] | None = None,
        locked: bool = True,
    ) -> torch.Tensor:
        # Each row's mask reaches the attention through `packed_rows`; the model is handed a
        # 4-D mask only so that it builds none of its own (its values are never read).
        tokens = inputs.input_ids.shape[1]
        columns = max(length + size for length, size in zip(lengths, inputs.sizes, strict=True))
        unused = torch.zeros((1, 1, tokens, columns), dtype=self.model.dtype, device=self.device)
        rows = packed_rows(inputs)
        return self._step(inputs.input_ids, inputs.position_ids, unused, cache, keep, rows, locked)[0]

    def _step(
        self,
        input_ids: torch.Tensor,  # [B, T]
        position_ids: torch.Tensor,  # [B, T]
        mask: Any,
        cache: Any,
        keep: Sequence[int] | None,
        attending: AbstractContextManager[None],
        locked: bool,
    ) -> torch.Tensor:
        """Logits ``[B, T, V]`` of a batched step's forward (``[B, len(keep), V]`` with
        ``keep``), its rows attending as ``attending`` has them."""
        kwargs: dict[str, Any] = {}
        where = None if keep is None else torch.tensor(keep, dtype=torch.long, device=self.device)
        if where is not None and self._logits_to_keep:
            kwargs["logits_to_keep"], where = where, None  # the model projects those alone
        with self._running(input_ids.numel(), locked) as run, attending:
            out = run(input_ids, cache, position_ids=position_ids, attention_mask=mask, **kwargs)
        return out.logits if where is None else out.logits[:, where]

    def synchronize(self) -> None:
        """Waits for the work queued on the device: on a GPU a forward returns once its kernels
        are launched, so a step timed without this would be timed by its launches alone."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def packs(self) -> bool:
        """Whether batched steps run packed (`forward_packed`): on a CPU model attending with
        `grouped_sdpa_attention`, where the probe's packed forward matched the padded one
        (probed with the trees, `tree_problem`)."""
        return self.tree_problem() is None and self._packs

    def packed_inputs(self, drafts: Sequence[StepDraft], lengths: Sequence[int]) -> PackedInputs:
        """The inputs of a packed step of ``drafts`` over rows of ``lengths`` cached tokens,
        with this model's masks (sliding windows cut out where its layers slide)."""
        return packed_inputs(drafts, lengths, self.device, self.model.dtype, self.layer_masks)

    def forward_step(self, draft: StepDraft, cache: Any, past: int) -> tuple[torch.Tensor, Any]:
        """Logits ``[len(draft), V]`` for a step's tree (then its side rows) after ``past`` tokens."""
        if len(draft) == 1:  # plain decoding: the model's own causal path
            return self.forward(torch.tensor([draft.tree.tokens]), cache)
        inputs = draft.inputs(past, self.device, self.model.dtype)
        return self.forward(
            inputs.input_ids,
            cache,
            position_ids=inputs.position_ids,
            attention_mask=self.layer_masks(inputs, [past]),
        )

    def measure_costs(
        self,
        max_tokens: int,
        cache_dir: Path | None = None,
        *,
        remeasure: bool = False,
        progress: bool = False,
    ) -> CostCurve:
        """Forward seconds by size up to ``max_tokens``: cached on disk (unless ``remeasure``),
        else measured now (with a progress bar if ``progress``); `costs` holds them from now on.
        The forwards run (timed once the device has done them) calibrate the curve
        (`StepCalibration`), and a curve read from the disk or measured under a load is checked
        against them (`CurveCheck`), and forgotten on disk if they contradict it
        (`CostModel.retire_contradicted`)."""
        from rag_lookahead.models import default_cache_dir

        window = getattr(self.model.config, "max_position_embeddings", None) or 512
        context = min(256, window // 2)
        key = self._curve_key(max_tokens)
        directory = (cache_dir or default_cache_dir()) / "costs"

        measured = []

        def measure() -> CostCurve:
            measured.append(True)
            return _watched(progress, "measuring forward costs (once)", self.chain_timer(context), max_tokens)

        curve = cached_curve(directory, key, measure, remeasure=remeasure, waiting=_waiting(progress))
        if curve == self.costs.curve and not measured and self.costs.calibration is not None:
            return curve  # read back again (another variant): what was learned of it stands
        self.costs.curve = curve
        self.costs.calibration = StepCalibration()  # a new curve, learned afresh
        trusted = measured and not curve.loaded
        self.costs.check = None if trusted else CurveCheck(context=context)
        self.costs.forget = functools.partial(forget_curve, directory, key, curve)
        return curve

    def measure_batch_costs(
        self,
        max_rows: int,
        max_width: int,
        cache_dir: Path | None = None,
        *,
        remeasure: bool = False,
        progress: bool = False,
    ) -> BatchCosts | None:
        """Batched forward seconds by width for 2, 4, 8, ... rows up to ``max_rows`` (cached on
        disk unless ``remeasure``, else measured now; `costs` holds them from now on); ``None``
        when no batch has two rows."""
        from rag_lookahead.models import default_cache_dir

        directory = (cache_dir or default_cache_dir()) / "costs"
        curves = []
        rows = 2
        while rows <= max_rows:
            key = {
                **self._curve_key(max_width),
                "rows": rows,
                "context": _BATCH_CONTEXT,
                "packed": self.packs(),
            }
            measure = functools.partial(self._measure_batch, rows, max_width, progress)
            curve = cached_curve(directory, key, measure, remeasure=remeasure, waiting=_waiting(progress))
            curves.append((rows, curve))
            rows *= 2
        self.costs.batch = BatchCosts(tuple(curves)) if curves else None
        return self.costs.batch

    def _measure_batch(self, rows: int, max_width: int, progress: bool) -> CostCurve:
        what = f"measuring costs of {rows}-row batches (once)"
        return _watched(progress, what, self._batch_timer(rows), max_width)

    def _batch_timer(self, rows: int) -> Callable[[int], float]:
        """Seconds of one batched forward of ``rows`` rows, each a chain of ``width`` tokens."""
        vocab = int(self.model.config.vocab_size)
        packs = self.packs()  # timed as the engine's steps run
        batch = BatchCache(packed=packs)
        for row in range(rows):
            prompt = [(31 * i + 7 * row + 3) % vocab for i in range(_BATCH_CONTEXT)]
            _, cache = self.forward(torch.tensor([prompt]), new_tree_cache(), last_only=True)
            batch.add_row(cache)

        def seconds(width: int) -> float:
            chain = DraftTree(tuple(range(3, 3 + width)), tuple(range(-1, width - 1)))
            drafts, dtype = [StepDraft(chain)] * rows, self.model.dtype
            if packs:
                packed = self.packed_inputs(drafts, batch.lengths)
                batch.prepare(packed)
                start = time.perf_counter()
                self.forward_packed(packed, batch.cache, batch.lengths)
            else:
                batch.prepare()
                inputs = batch_inputs(drafts, batch.lengths, self.device, dtype)
                start = time.perf_counter()
                self.forward_batch(inputs, batch.cache, batch.lengths)
            self.synchronize()
            return time.perf_counter() - start  # nothing kept: the rows' lengths stay as they were

        return seconds

    def _kernel_timer(self, direct: bool) -> ForwardSeconds:
        """Seconds of this runner's forward of so many tokens after a short prompt (a step's
        chained draft tokens, or a prompt's chunk) on the linear kernels given, ``None`` past
        the model's window: the forwards `linear_used` chooses the kernels by (direct, with
        ``direct``, where the model's direct forward matches its own)."""
        window = getattr(self.model.config, "max_position_embeddings", None) or 512
        context = min(_KERNEL_CONTEXT, window // 2)
        # Timed as the forwards will run: directly where the model has a direct forward (only
        # its speed counts here; it is probed for exactness once the kernels are chosen).
        self.direct = DirectForward.of(self.model) if direct else None
        try:
            step, chunk = self.chain_timer(context), self.chunk_timer(context)
        except Exception:  # a direct forward the probe would refuse: the model's own
            self.direct = None
            step, chunk = self.chain_timer(context), self.chunk_timer(context)

        def seconds(kernels: LinearKernels, tokens: int, prompt: bool) -> float | None:
            if context + tokens > window:
                return None
            chosen, self.linear = self.linear, kernels
            try:
                return chunk(tokens) if prompt else step(tokens)
            except Exception:  # a forward this model does not run so: timed on its layers
                return None
            finally:
                self.linear = chosen

        return seconds

    def chunk_timer(self, context_length: int) -> Callable[[int], float]:
        """Seconds of one forward of a prompt's chunk of k tokens after ``context_length``
        tokens (its logits at its last token alone)."""
        vocab = int(self.model.config.vocab_size)
        prompt = [(31 * i + 7) % vocab for i in range(context_length)]
        _, cache = self.forward(torch.tensor([prompt]), new_tree_cache(), last_only=True)

        def seconds(tokens: int) -> float:
            ids = torch.tensor([[prompt[(5 * i + 3) % context_length] for i in range(tokens)]])
            start = time.perf_counter()
            self.forward(ids, cache, last_only=True)
            self.synchronize()
            elapsed = time.perf_counter() - start
            cache.crop(-tokens)
            return elapsed

        return seconds

    def chain_timer(self, context_length: int) -> Callable[[int], float]:
        """Seconds of one forward over k chained draft tokens after ``context_length`` tokens."""
        vocab = int(self.model.config.vocab_size)
        prompt = [(31 * i + 7) % vocab for i in range(context_length)]
        _, cache = self.forward(torch.tensor([prompt]), new_tree_cache(), last_only=True)

        def seconds(tokens: int) -> float:
            chain = tuple(prompt[i % context_length] for i in range(tokens))
            tree = DraftTree(chain, tuple(range(-1, tokens - 1)))
            start = time.perf_counter()
            self.forward_step(StepDraft(tree), cache, context_length)
            self.synchronize()
            elapsed = time.perf_counter() - start
            cache.crop(-tokens)
            return elapsed

        return seconds


def _training_problem(model: Any) -> str | None:
    """Why a model in training mode decodes plainly: as `generate` would, each forward with its
    dropout drawn anew where it has some (a draft's verification would draw other masks)."""
    if not any(module.training for module in model.modules()):
        return None
    return (
        "it is in training mode (model.train(), or a module added in its default training "
        "mode), where dropout draws anew at every forward: call model.eval() to draft again"
    )


def _matching_direct(runner: ModelRunner) -> DirectForward | None:
    """The model's direct forward (`DirectForward`), where it has one and it gives the model's
    own forward's logits and cache entries bit for bit, through the runner's own paths: a
    prompt, one token after it, a draft tree under its mask, and a batch of two rows; else
    ``None`` (the model's own forward runs)."""
    direct = DirectForward.of(runner.model)
    if direct is None:
        return None
    try:
        want = _probe_outputs(runner)
        runner.direct = direct
        got = _probe_outputs(runner)
    except Exception:  # any failure means "the model's own forward", never a crash
        return None
    finally:
        runner.direct = None
    same = len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    return direct if same else None


def _probe_outputs(runner: ModelRunner) -> list[torch.Tensor]:
    """The logits and cache entries of the direct forward's probe (`_matching_direct`)."""
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


def _packed_matches(runner: ModelRunner) -> bool:
    """Whether a packed forward of two rows (a tree after 5 cached tokens, one token after 9,
    each past the sliding window if the model has one) gives the padded forward's logits: a
    model that reads its keys' or mask's shapes in its own way, or attends with something the
    packed rows cannot express, fails it."""
    model, vocab = runner.model, int(runner.model.config.vocab_size)
    drafts = _probe_drafts(vocab)

    @torch.inference_mode()
    def prefill(prompt: torch.Tensor) -> Any:
        cache = new_tree_cache()
        model(input_ids=prompt, use_cache=True, **{runner.cache_arg: cache})
        return cache

    try:
        past = runner.layer_masks.window or 0  # the rows outgrow a sliding window: it is cut
        lengths = (5 + past, 9 + past)
        padded = _probe_batch(prefill, lengths, vocab, runner.device)
        packed = _probe_batch(prefill, lengths, vocab, runner.device, packed=True)
        padded.prepare()
        inputs = batch_inputs(drafts, padded.lengths, runner.device, model.dtype)
        want = runner._padded(inputs, padded.cache, padded.lengths, locked=False).float()  # [2, 4, V]
        want = torch.cat([want[0], want[1, :1]])  # [5, V]
        side_by_side = runner.packed_inputs(drafts, packed.lengths)
        packed.prepare(side_by_side)
        got = runner._packed(side_by_side, packed.cache, packed.lengths, locked=False).float()  # [5, V]
    except Exception:  # any failure means "padded steps", never a crash
        return False
    tolerance = 1e-3 if runner.model.dtype == torch.float32 else 5e-2
    return bool((got - want).abs().max().item() <= tolerance * max(want.abs().max().item(), 1e-6))


def _watched(progress: bool, what: str, forward: Callable[[int], float], max_tokens: int) -> CostCurve:
    """The curve of ``forward`` up to ``max_tokens``, measured with a progress bar saying
    ``what``: marked ``loaded`` if other work shared the cores meanwhile (by the system's load,
    or by sizes whose times never settled), so that the disk keeps it briefly."""
    with watch_load() as seen, progress_bar(progress, what, unit="forward") as bar:
        curve = measure_curve(forward, max_tokens, bar=bar)
    return dataclasses.replace(curve, loaded=True) if seen[0].busy else curve


def _waiting(progress: bool) -> str | None:
    """What to say while another process measures the same costs (where progress is shown)."""
    return "waiting for another process measuring the same forward costs ..." if progress else None
