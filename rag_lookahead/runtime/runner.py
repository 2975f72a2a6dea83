"""The model's forward passes: the one place that runs the model.

The engine decides what to run; this module runs it over a KV cache — the prompt, a draft tree
(with the Jacobi window's rows, if any), a batch of them — as its `Backend` says: nothing here
times, probes or chooses (`rag_lookahead.tuning` does, each timer or probe on runners of its
own).
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from rag_lookahead.decoding.tree import PackedInputs, StepDraft, TreeInputs, packed_inputs
from rag_lookahead.runtime.attention import (
    ATTENTION_NAME,
    LAYOUT,
    CausalChunk,
    PackedRows,
    RaggedRows,
    RowLayout,
    register,
)
from rag_lookahead.runtime.backend import Backend
from rag_lookahead.runtime.direct import DirectForward
from rag_lookahead.runtime.kernels import LinearKernels, OneDnnLayers
from rag_lookahead.runtime.kv_cache import cache_kwarg
from rag_lookahead.runtime.layer_masks import LayerMasks
from rag_lookahead.runtime.memory import large_blocks_expected
from rag_lookahead.runtime.static import StaticStep
from rag_lookahead.runtime.threads import ModelThread

__all__ = ["ModelRunner"]

# One forward: logits and cache of ``(input_ids, cache, position_ids=, attention_mask=,
# logits_to_keep=)`` (the model's own, or `DirectForward`).
Forward = Callable[..., Any]


class ModelRunner:
    """Forward passes of one model as its `Backend` says, serialised by its own lock (engine
    variants share it) and run by a `ModelThread` (``thread``, or the process's shared one).

    On a CPU its fp32 linear layers run on the backend's kernel for a forward's tokens, over
    ``layers`` (the model's layers on oneDNN, with their reordered copies where a kernel reads
    them); with ``forward="direct"`` it runs ``direct`` wherever that still applies to the model
    (`DirectForward.applies`, checked at each forward), else the model's own forward. After the
    model's structure changed the tuning wing derives another backend, which `use` installs."""

    def __init__(
        self,
        model: Any,
        backend: Backend,
        *,
        layers: OneDnnLayers | None = None,
        direct: DirectForward | None = None,
        static: StaticStep | None = None,
        thread: ModelThread | None = None,
    ) -> None:
        self.model = model
        self.thread = thread or ModelThread.shared()
        if self.device.type == "cpu":
            self.thread.call(large_blocks_expected)
        self.lock = threading.RLock()
        self.cache_arg = cache_kwarg(model)
        self.layer_masks = LayerMasks.of(model.config)
        parameters = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in parameters
        # Whether the model's forward hands extra keywords on (to its attention, as transformers'
        # models do): a forward's `RowLayout` travels that way.
        self._hands_keywords_on = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        self.use(backend, layers=layers, direct=direct, static=static)

    def use(
        self,
        backend: Backend,
        *,
        layers: OneDnnLayers | None,
        direct: DirectForward | None,
        static: StaticStep | None = None,
    ) -> None:
        """Run on ``backend`` from the next forward on (over ``layers``, with ``direct`` where
        its forward is ``"direct"``, the batch's steps on ``static`` where its step is static
        or captured): the tuning wing's choice again, after the model changed."""
        if backend.forward == "direct" and direct is None:
            raise ValueError("a backend whose forward is 'direct' runs a DirectForward: none was given")
        if (backend.step != "eager") != (static is not None):
            raise ValueError(f"a backend whose step is {backend.step!r} runs a static step iff not eager")
        if layers is None and any(kernel != "torch" for _, kernel in backend.linear):
            raise ValueError(f"the linear kernels {backend.linear_name} run on OneDnnLayers: none given")
        with self.lock:
            self.backend = backend
            self.linear = LinearKernels(backend.linear, layers)
            self.direct = direct if backend.forward == "direct" else None
            # The batch's static step (`rag_lookahead.runtime.static`), where it runs one.
            self.static = static
            # Only the engine's own attention reads a layout (another would be handed a keyword
            # it does not know).
            self._layouts = backend.attention == ATTENTION_NAME and self._hands_keywords_on

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextmanager
    def _running(self, tokens: int) -> Iterator[Forward]:
        """One forward of ``tokens`` tokens, by the function given: alone on the model, without
        autograd, on the backend's attention and the linear kernel chosen for so many tokens;
        the direct forward where there is one and the model is still as it read it
        (`DirectForward.applies`), else the model's own."""
        with self.lock:  # (the backend read once: `use` may replace it between two forwards)
            linear, direct = self.linear, self.direct
            direct = direct if direct is not None and direct.applies() else None
            with torch.inference_mode():
                if direct is not None:  # (it takes its attention and kernel as arguments)
                    yield functools.partial(direct, linear=linear.function(tokens))
                else:
                    with self._model_as_backend_says(linear, tokens):
                        yield self._model_forward

    @contextmanager
    def _model_as_backend_says(self, linear: LinearKernels, tokens: int) -> Iterator[None]:
        """For the duration of one forward of the model's own code, its attention and its fp32
        linear layers are the backend's. The one place the engine configures a forward by
        state, not arguments: transformers looks a layer's attention up by the name in the
        model's config at each call, and the model calls its own ``Linear`` modules. Outside,
        the model is as it was (its config names its own attention again)."""
        config = self.model.config
        attention = self.backend.attention
        named = attention == ATTENTION_NAME and config._attn_implementation == "sdpa"
        with linear.running(tokens):
            if not named:
                yield
                return
            config._attn_implementation = register()
            try:
                yield
            finally:
                config._attn_implementation = "sdpa"

    def _arguments(self, layout: RowLayout | None) -> dict[str, Any]:
        """The forward's keyword that carries ``layout`` to the attention, where it reads one."""
        return {LAYOUT: layout} if layout is not None and self._layouts else {}

    def _model_forward(
        self, input_ids: torch.Tensor, cache: Any, logits_to_keep: Any = None, **kwargs: Any
    ) -> Any:
        """The model's own forward, called as `DirectForward` is."""
        if logits_to_keep is not None:  # (given only where the model takes it)
            kwargs["logits_to_keep"] = logits_to_keep
        return self.model(input_ids=input_ids, use_cache=True, **{self.cache_arg: cache}, **kwargs)

    def forward(
        self, input_ids: torch.Tensor, cache: Any, last_only: bool = False, **kwargs: Any
    ) -> tuple[torch.Tensor, Any]:
        """Logits ``[n, V]`` for ``input_ids`` ``[1, n]``, and the cache now holding them.

        ``cache=None`` lets the model build the cache it prefers (plain decoding).
        """
        if last_only and self._logits_to_keep:
            kwargs["logits_to_keep"] = 1
        # Tokens in order after the cache, under the model's own causal mask: a prompt's chunk,
        # whose attention multiplies on oneDNN where its linear layers do (the faster here).
        tokens = input_ids.numel()
        chunk = input_ids.shape[-1] > 1 and not {"attention_mask", "position_ids"} & kwargs.keys()
        layout = CausalChunk(self.linear.kernel(tokens) != "torch") if chunk else None
        with self._running(tokens) as run:
            out = run(input_ids.to(self.device), cache, **kwargs, **self._arguments(layout))
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
        width = inputs.input_ids.shape[1]
        rows = RaggedRows.of([length + width for length in lengths])
        mask = self.layer_masks(inputs, lengths)
        return self._step(inputs.input_ids, inputs.position_ids, mask, cache, keep, rows)

    def forward_packed(
        self, inputs: PackedInputs, cache: Any, lengths: Sequence[int], keep: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Logits ``[N, V]`` for packed step inputs over rows of ``lengths`` cached tokens (see
        `rag_lookahead.runtime.batch`); with ``keep`` (ascending), only at those of the ``N``
        tokens, ``[len(keep), V]``. Where `packs` (or probing whether it may)."""
        # Each row's mask reaches the attention in its `PackedRows`; the model is handed a 4-D
        # mask only so that it builds none of its own (its values are never read).
        tokens = inputs.input_ids.shape[1]
        columns = max(length + size for length, size in zip(lengths, inputs.sizes, strict=True))
        unused = torch.zeros((1, 1, tokens, columns), dtype=self.model.dtype, device=self.device)
        rows = PackedRows.of(inputs)
        return self._step(inputs.input_ids, inputs.position_ids, unused, cache, keep, rows)[0]

    def _step(
        self,
        input_ids: torch.Tensor,  # [B, T]
        position_ids: torch.Tensor,  # [B, T]
        mask: Any,
        cache: Any,
        keep: Sequence[int] | None,
        layout: RowLayout | None,
    ) -> torch.Tensor:
        """Logits ``[B, T, V]`` of a batched step's forward (``[B, len(keep), V]`` with
        ``keep``), its rows laid out as ``layout`` says."""
        kwargs = self._arguments(layout)
        where = None if keep is None else torch.tensor(keep, dtype=torch.long, device=self.device)
        if where is not None and self._logits_to_keep:
            kwargs["logits_to_keep"], where = where, None  # the model projects those alone
        with self._running(input_ids.numel()) as run:
            out = run(input_ids, cache, position_ids=position_ids, attention_mask=mask, **kwargs)
        return out.logits if where is None else out.logits[:, where]

    def synchronize(self) -> None:
        """Waits for the work queued on the device: on a GPU a forward returns once its kernels
        are launched, so a step timed without this would be timed by its launches alone."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def packs(self) -> bool:
        """Whether batched steps run packed (`forward_packed`): the backend's batch layout,
        unless they run on a static step (padded to its buckets)."""
        return self.backend.batch_layout == "packed" and self.static is None

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
