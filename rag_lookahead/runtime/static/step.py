"""The static-shape step: draft trees of several rows forwarded in one of a few fixed shapes.

Every forward reads persistent buffers of its bucket (`Buckets`): token ids ``[R, W]``,
positions ``[R, W]``, the 4-D mask ``[R, 1, W, max_len]`` (one per layer type where sliding and
full layers mix) and the cache's write columns ``[R, W]``; they are filled in place before the
forward, and the model reads and writes nothing else but its `SlotCache`. Row ``r``'s tree
sits at columns ``lengths[r]`` on (its nodes contiguous after its committed entries); its
padding slots, and whole padding rows, see only their own column, so no real node sees them
and the walk (`rag_lookahead.decoding.verify.accept`) never reaches them. After verification
`keep` gathers the accepted path to the next columns; the rest is overwritten later.

On a CUDA device each bucket's forward is captured once (`capture`) as a `torch.cuda.CUDAGraph`
and replayed; where a model cannot be captured (`capture_problem`) or a capture fails, the
same forward runs eagerly over the same buffers, and the reason is kept in ``problems``. On a
CPU the forward always runs eagerly: everything but the capture call itself is the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rag_lookahead.decoding.tree import DraftTree, StepDraft, step_inputs
from rag_lookahead.runtime.kv_cache import cache_kwarg
from rag_lookahead.runtime.layer_masks import LayerMasks
from rag_lookahead.runtime.static.buckets import Bucket, Buckets
from rag_lookahead.runtime.static.slot_cache import SlotCache

__all__ = ["StaticStep", "capture_problem", "static_problem"]

# Attention functions that read an explicit 4-D additive mask (flash-attention's kernels take
# none, so they cannot verify a tree).
_MASKED_ATTENTION = ("sdpa", "eager")
# A row's step: a draft tree, or a tree with side rows (a Jacobi window's).
Draft = DraftTree | StepDraft
# Warm-up forwards before a capture: the first ones allocate and pick kernels.
_WARMUPS = 3


def static_problem(model: Any) -> str | None:
    """Why ``model`` cannot run a static step, or ``None`` where it can."""
    attention = getattr(model.config, "_attn_implementation", None)
    if attention not in _MASKED_ATTENTION:
        return f"attention {attention!r} takes no explicit tree mask (static steps need sdpa or eager)"
    unsupported = LayerMasks.of(model.config).unsupported
    if unsupported:
        return f"layer types {', '.join(unsupported)} have no tree mask"
    return None


def capture_problem(model: Any) -> str | None:
    """Why ``model``'s static step cannot be captured as CUDA graphs, or ``None`` where it can."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return f"captured graphs run on CUDA devices, the model is on {device.type}"
    everywhere = torch.nn.modules.module
    if everywhere._global_forward_hooks or everywhere._global_forward_pre_hooks:
        return "global forward hooks are registered: they would not run in a replay"
    hooked = [
        name or "the model"
        for name, module in model.named_modules()
        if module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook")
    ]
    if hooked:
        return f"forward hooks on {hooked[0]} (and {len(hooked) - 1} more) would not run in a replay"
    return static_problem(model)


@dataclass
class _Buffers:
    """One bucket's persistent inputs and, once captured, its graph and output."""

    ids: torch.Tensor  # [R, W]
    positions: torch.Tensor  # [R, W]
    masks: dict[str, torch.Tensor]  # each [R, 1, W, max_len]; key "" for a single mask
    graph: Any = None  # torch.cuda.CUDAGraph once captured
    logits: torch.Tensor | None = None  # [R, W, V]: the graph's output
    replays: int = 0


@dataclass
class _Record:
    """What capturing cost: seconds per bucket, and why a bucket or the model was not."""

    seconds: dict[Bucket, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


class StaticStep:
    """Static-shape forwards of one model over a `SlotCache` of ``buckets.most_rows`` slots of
    ``max_len`` columns each (see the module's docstring)."""

    def __init__(self, model: Any, max_len: int, buckets: Buckets | None = None) -> None:
        problem = static_problem(model)
        if problem is not None:
            raise ValueError(f"this model cannot run a static step: {problem}")
        self.model = model
        self.buckets = buckets or Buckets()
        self.device = next(model.parameters()).device
        self.dtype = model.dtype
        self.max_len = max_len
        text = model.config.get_text_config(decoder=True)
        positions = getattr(text, "max_position_embeddings", None)
        if isinstance(positions, int) and max_len > positions:
            raise ValueError(f"a static step of {max_len} columns exceeds the model's {positions} positions")
        self.layer_masks = LayerMasks.of(model.config)
        self._cache_arg = cache_kwarg(model)
        layers = text.num_hidden_layers
        self.cache = SlotCache(layers, self.buckets.most_rows, max_len, self.buckets.widest, self.device)
        self._buffers: dict[Bucket, _Buffers] = {}
        self.record = _Record()
        self._weights: tuple[int, ...] = ()  # where the captured graphs read the weights
        with torch.inference_mode():  # one forward allocates every layer's slots
            self._forward(self._buffers_of(self.fill_scratch(Bucket(1, 1))))

    @property
    def captured(self) -> tuple[Bucket, ...]:
        """The buckets replayed as captured graphs."""
        return tuple(b for b, buffers in self._buffers.items() if buffers.graph is not None)

    @torch.inference_mode()
    def capture(
        self, buckets: Sequence[Bucket] | None = None, done: Callable[[Bucket], None] | None = None
    ) -> None:
        """Capture each of ``buckets`` (all, by default, the largest first) as a CUDA graph,
        dropping any captured before (``done(bucket)`` after each); where the model or a bucket
        cannot be, say why once in ``record.problems`` and leave them eager. Between any two
        steps: warm-ups and captures write only scratch columns (`fill_scratch`)."""
        for buffers in self._buffers.values():
            buffers.graph, buffers.logits = None, None
        problem = capture_problem(self.model)
        if problem is not None:
            self.record.problems.append(f"not captured: {problem}")
            return
        self._weights = _weight_addresses(self.model)
        pool = torch.cuda.graph_pool_handle()
        for bucket in buckets if buckets is not None else self.buckets.all():
            try:
                self._capture(bucket, pool)
            except (RuntimeError, torch.cuda.OutOfMemoryError) as err:
                self._buffers[bucket].graph = None
                self.record.problems.append(f"bucket {bucket} runs eager: {type(err).__name__}: {err}")
            if done is not None:
                done(bucket)

    def weights_moved(self) -> bool:
        """Whether a captured graph would read a weight where it no longer is: the model's
        parameters or buffers were replaced since the capture (written in place, the graphs
        read their new values)."""
        return bool(self.captured) and _weight_addresses(self.model) != self._weights

    def _capture(self, bucket: Bucket, pool: Any) -> None:
        start = time.perf_counter()
        buffers = self._buffers_of(self.fill_scratch(bucket))
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(_WARMUPS):
                self._forward(buffers)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            buffers.logits = self._forward(buffers)
        buffers.graph = graph
        self.synchronize()
        self.record.seconds[bucket] = time.perf_counter() - start

    def synchronize(self) -> None:
        """Wait for the work queued on the device (a GPU returns once a forward is queued)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self, drafts: Sequence[Draft], lengths: Sequence[int]) -> torch.Tensor:
        """Logits ``[R, W, V]`` of the bucket holding ``drafts`` (row ``r`` over slot ``r``,
        after its ``lengths[r]`` committed columns): row ``r``'s node ``i`` at ``[r, i]`` (a
        `StepDraft`'s tree, then its side rows). A view of a persistent output where the bucket
        is captured: read it before the next `run`. `prepare` then `forward`."""
        return self.forward(self.prepare(drafts, lengths))

    @torch.inference_mode()
    def prepare(self, drafts: Sequence[Draft], lengths: Sequence[int]) -> Bucket:
        """Fill the buffers of the bucket holding ``drafts`` (see `run`) in place: that bucket.
        Refused where the model's attention no longer reads the tree mask (set since the step
        was built: its answers would be wrong)."""
        attention = getattr(self.model.config, "_attn_implementation", None)
        if attention not in _MASKED_ATTENTION:
            raise ValueError(
                f"the model's attention is now {attention!r}, which takes no tree mask (a static "
                "step needs sdpa or eager): say the model changed (LookaheadEngine.model_changed) "
                "to have its step chosen again"
            )
        steps = [draft if isinstance(draft, StepDraft) else StepDraft(draft) for draft in drafts]
        bucket = self.buckets.fit(len(steps), max(len(step) for step in steps))
        self._fill(bucket, steps, lengths)
        return bucket

    @torch.inference_mode()
    def fill_scratch(self, bucket: Bucket) -> Bucket:
        """Fill ``bucket``'s buffers with a step that writes only scratch columns (every row's
        last ``width``, which no committed entry reaches: see `scratch`), so that warm-ups,
        captures and timings run between any two steps without touching a row's entries."""
        self._fill(bucket, [StepDraft(DraftTree.root_only(0))], [self.scratch(bucket.width)])
        return bucket

    def scratch(self, width: int) -> int:
        """The first of each slot's scratch columns for a step ``width`` wide: a row's
        committed entries end at least ``buckets.widest`` columns before ``max_len``."""
        return self.max_len - width

    @torch.inference_mode()
    def forward(self, bucket: Bucket) -> torch.Tensor:
        """The forward of ``bucket`` over what its buffers hold (`prepare`): replayed where
        captured, else run. Logits ``[R, W, V]`` (see `run`)."""
        buffers = self._buffers_of(bucket)
        buffers.replays += 1
        if buffers.graph is not None:
            buffers.graph.replay()
            assert buffers.logits is not None
            return buffers.logits
        return self._forward(buffers)

    @torch.inference_mode()
    def load(self, slot: int, entries: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """A prompt's KV entries (`SlotCache.load`) into ``slot``."""
        self.cache.load(slot, entries)

    @torch.inference_mode()
    def keep(self, slot: int, length: int, nodes: Sequence[int]) -> None:
        """Keep the accepted tree ``nodes`` of ``slot``'s last step (root first), whose tree
        sat at columns ``length`` on: they move to columns ``length..length+len(nodes)-1``."""
        if list(nodes) != list(range(len(nodes))):  # (a prefix of the tree is in place already)
            sources = torch.tensor(nodes, dtype=torch.long, device=self.device) + length
            self.cache.move(slot, sources, length)

    @torch.inference_mode()
    def copy_slot(self, source: int, target: int, length: int) -> None:
        """Move a row's ``length`` committed columns from slot ``source`` to ``target``."""
        self.cache.copy_slot(source, target, length)

    def _buffers_of(self, bucket: Bucket) -> _Buffers:
        if bucket not in self._buffers:
            rows, width = bucket
            shape = (rows, 1, width, self.max_len)
            kinds = ("full_attention", "sliding_attention") if self.layer_masks.by_type else ("",)
            self._buffers[bucket] = _Buffers(
                ids=torch.zeros((rows, width), dtype=torch.long, device=self.device),
                positions=torch.zeros((rows, width), dtype=torch.long, device=self.device),
                masks={kind: torch.zeros(shape, dtype=self.dtype, device=self.device) for kind in kinds},
            )
        return self._buffers[bucket]

    def _fill(self, bucket: Bucket, drafts: Sequence[StepDraft], lengths: Sequence[int]) -> None:
        """Write a step's inputs into ``bucket``'s buffers and the cache's columns, in place."""
        rows, width = bucket
        real = len(drafts)
        if len(lengths) != real or real > rows or any(len(draft) > width for draft in drafts):
            raise ValueError(f"{real} drafts over {len(lengths)} lengths do not fit bucket {bucket}")
        if any(length < 0 or length + width > self.max_len for length in lengths):
            raise ValueError(f"a step of {width} slots after {max(lengths)} columns exceeds {self.max_len}")
        buffers = self._buffers_of(bucket)
        inputs = step_inputs(drafts, lengths, self.device, self.dtype)
        used = inputs.input_ids.shape[1]  # T <= W: the widest real tree
        masks = self.layer_masks(inputs, lengths)
        masks = masks if isinstance(masks, dict) else {"": masks}
        # Every slot's own column: a real row's from its length on, a padding row's among the
        # scratch columns (its slot may hold a row the step leaves out).
        starts = torch.full((rows,), self.scratch(width), dtype=torch.long, device=self.device)
        starts[:real] = torch.tensor(list(lengths), dtype=torch.long, device=self.device)
        own = starts[:, None] + torch.arange(width, device=self.device)  # [R, W]
        self.cache.columns[:rows, :width].copy_(own)
        buffers.ids.zero_()
        buffers.ids[:real, :used].copy_(inputs.input_ids)
        # (a padding slot at position 0: inside any learned position table)
        buffers.positions.zero_()
        buffers.positions[:real].copy_(starts[:real, None].expand(real, width))
        buffers.positions[:real, :used].copy_(inputs.position_ids)
        hidden = torch.finfo(self.dtype).min
        for kind, buffer in buffers.masks.items():
            # Padding sees only itself (a finite softmax, nothing real reads it); then the rows'
            # real masks over their first columns.
            buffer.fill_(hidden).scatter_(3, own[:, None, :, None], 0.0)
            mask = masks[kind]  # [real, 1, T, max(lengths) + T]
            buffer[:real, :, :used, : mask.shape[-1]].copy_(mask)

    def _forward(self, buffers: _Buffers) -> torch.Tensor:
        """The model's own forward over ``buffers`` and the slot cache: logits ``[R, W, V]``."""
        masks = buffers.masks
        mask: Any = masks[""] if "" in masks else dict(masks)
        out = self.model(
            input_ids=buffers.ids,
            position_ids=buffers.positions,
            attention_mask=mask,
            use_cache=True,
            **{self._cache_arg: self.cache},
        )
        return out.logits


def _weight_addresses(model: Any) -> tuple[int, ...]:
    """Where each of ``model``'s parameters and buffers lies now."""
    return tuple(t.data_ptr() for t in (*model.parameters(), *model.buffers()))
