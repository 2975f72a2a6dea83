"""The engine: the decoding loop, whose `ModelRunner` is the only thing that runs the model.

Each step reads as five verbs: draft a tree, forward it over the KV cache in one pass, choose
the model's token at every node, accept the longest agreeing path, keep only that path in the
cache. The engine knows nothing about where drafts come from: drafters see token ids only.
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Generator, Iterable, Sequence

import torch

from rag_lookahead.budget import StepPlanner
from rag_lookahead.cache import keep_accepted, new_tree_cache
from rag_lookahead.costs import CostCurve
from rag_lookahead.config import GenerationParams, LookaheadConfig
from rag_lookahead.drafting.base import WindowedDrafter
from rag_lookahead.drafting.merge import MergedDrafter, build_drafter
from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.probe import sliding_window
from rag_lookahead.prompts import Prompt, encode_prompt
from rag_lookahead.runner import ModelRunner
from rag_lookahead.scope import DocumentScope
from rag_lookahead.stream import Completion, StepRecorder, TextStream, truncate_step
from rag_lookahead.text import TextAssembler
from rag_lookahead.tree import DraftTree, SideRows
from rag_lookahead.verify import TokenChooser, accept

__all__ = ["LookaheadEngine"]


class LookaheadEngine:
    """Lossless lookahead decoding for a Hugging Face decoder-only model.

    The engine owns a token trie shared by all calls: each call's prompt and documents are
    inserted as branches owned by that call and eliminated when it ends, while the model's own
    outputs stay (pruned under the node cap) and help later calls. Calls from several threads
    are safe: model forwards and trie updates are serialised.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: LookaheadConfig | None = None,
        trie: TokenTrie | None = None,
        *,
        cost_curve: CostCurve | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        """Wrap ``model`` and ``tokenizer``.

        Args:
            config: Drafting settings (`LookaheadConfig`).
            trie: A trie to share or reuse (e.g. `TokenTrie.load`); a new one by default.
            cost_curve: Forward costs by size, for ``mode="auto"``; measured on first use and
                cached under ``cache_dir`` (default: `default_cache_dir`) when not given.
            cache_dir: Where measured cost curves are kept.
        """
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError("rag-lookahead needs a decoder-only (causal) language model")
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or LookaheadConfig()
        self.trie = trie or TokenTrie(
            max_query_length=self.config.max_query_length,
            branch_length=self.config.branch_length,
            max_nodes=self.config.max_trie_nodes,
        )
        self.planner = StepPlanner(self.config, lambda: self.cost_curve)
        self._cost_curve = cost_curve
        self._cache_dir = cache_dir
        self._lock = threading.RLock()
        self.runner = ModelRunner(model, self._lock)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | None = None,
        *,
        config: LookaheadConfig | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        trust_remote_code: bool = False,
    ) -> LookaheadEngine:
        """Load a model offline (``None``: the embedded SmolLM2-135M-Instruct) and wrap it."""
        from rag_lookahead.models import load_model

        model, tokenizer = load_model(
            name_or_path, device=device, dtype=dtype, trust_remote_code=trust_remote_code
        )
        return cls(model, tokenizer, config)

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def context_window(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The model's end-of-sequence tokens (generation config first, then tokenizer)."""
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return ()
        return (eos,) if isinstance(eos, int) else tuple(eos)

    # ------------------------------------------------------------------ public calls

    def stream(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        documents: Iterable[str] = (),
        scope: DocumentScope | None = None,
        **overrides: Any,
    ) -> TextStream:
        """Generate for ``prompt``, yielding new text as it is decided.

        Args:
            prompt: Plain text, token ids, or chat messages (formatted by the chat template).
            params: Token choice and stopping; keyword ``overrides`` replace single fields,
                e.g. ``max_new_tokens=64``.
            documents: Texts this call may draft from besides its prompt (retrieved passages).
            scope: A `DocumentScope` (from `scope`) whose documents this call may draft from.
        """
        params = (params or GenerationParams()).with_overrides(**overrides)
        prompt_ids = encode_prompt(self.tokenizer, prompt)
        self._check_length(prompt_ids)
        if scope is not None and scope.closed:
            raise ValueError("the document scope passed to this call is closed")
        if scope is not None and scope.trie is not self.trie:
            # Its branches live in another trie: this call could neither see nor release them.
            raise ValueError("the document scope passed to this call belongs to another engine")
        recorder = StepRecorder(prompt_tokens=len(prompt_ids))
        steps = self._run(prompt_ids, params, list(documents), recorder, scope)
        return TextStream(steps, TextAssembler(self.tokenizer, params.stop_strings), recorder)

    def complete(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        documents: Iterable[str] = (),
        scope: DocumentScope | None = None,
        **overrides: Any,
    ) -> Completion:
        """Blocking `stream`: the whole new text, its token ids and the stats."""
        return self.stream(prompt, params, documents=documents, scope=scope, **overrides).complete()

    def scope(self, documents: Iterable[str] = ()) -> DocumentScope:
        """Documents for several calls: insert them now, eliminate them when the scope closes.

        Use it as ``with engine.scope(passages) as docs: engine.complete(q, scope=docs)``;
        calls not given the scope never draft from its documents.
        """
        scope = DocumentScope(self.trie, self._lock, self._tokenize)
        scope.add(documents)
        return scope

    def plain(self) -> LookaheadEngine:
        """An engine on the same model that decodes plainly (``mode="off"``): the reference.

        It shares this engine's lock, so the two can serve threads side by side.
        """
        other = LookaheadEngine(
            self.model, self.tokenizer, replace(self.config, mode="off"), self.trie,
            cost_curve=self._cost_curve, cache_dir=self._cache_dir,
        )
        other._lock, other.runner = self._lock, self.runner
        return other

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Drop-in for `model.generate`: see `rag_lookahead.hf_compat.generate`."""
        from rag_lookahead.hf_compat import generate

        return generate(self, input_ids, **kwargs)

    @property
    def tree_verification(self) -> bool:
        """Whether this model verifies drafts (else it decodes plainly, as warned once)."""
        return self._tree_problem() is None

    def _tree_problem(self) -> str | None:
        return "mode is 'off'" if self.config.mode == "off" else self.runner.tree_problem()

    # ------------------------------------------------------------------ decoding

    def _check_length(self, prompt_ids: Sequence[int]) -> None:
        window = self.context_window
        if window is not None and len(prompt_ids) >= window:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens; the model's context window is {window}"
            )

    def _lookahead_problem(self, prompt_ids: list[int], params: GenerationParams) -> str | None:
        """Why this call must decode plainly, if it must."""
        problem = self._tree_problem()
        if problem is not None:
            return problem
        window = sliding_window(self.model.config)
        cfg = self.config
        longest = len(prompt_ids) + params.max_new_tokens + cfg.decoding_length
        if window is not None and longest + cfg.window_size + cfg.ngram_size > window:
            # One mask serves every layer, so a window's cut-off cannot be expressed in it.
            warnings.warn(
                f"rag-lookahead: this call may exceed the model's sliding attention window "
                f"({window} tokens); decoding it plainly, without lookahead.",
                stacklevel=4,
            )
            return "sliding window"
        return None

    def _drafter(
        self, prompt_ids: list[int], documents: list[str], scope: DocumentScope | None
    ) -> MergedDrafter:
        doc_ids = [self._tokenize(d) for d in documents]
        shared = (scope.owner, scope.sequences) if scope is not None else None
        return build_drafter(self.config, self.trie, self._lock, [prompt_ids, *doc_ids], shared)

    def _tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def _run(
        self,
        prompt_ids: list[int],
        params: GenerationParams,
        documents: list[str],
        rec: StepRecorder,
        scope: DocumentScope | None,
    ) -> Generator[list[int], None, None]:
        lookahead = self._lookahead_problem(prompt_ids, params) is None
        eos = set(self.eos_token_ids if params.eos_token_id is None else params.eos_token_id)
        window = self.context_window or 1 << 62
        chooser = TokenChooser(params, self.device)
        ids = list(prompt_ids)
        drafter: MergedDrafter | None = None
        try:
            # 1) Prefill: the prompt, and the first new token from its last position. The trie
            # takes the call's texts meanwhile (on a GPU the forward is still running).
            cache = new_tree_cache() if lookahead else None
            logits, cache = self.runner.forward(torch.tensor([ids]), cache, last_only=True)
            drafter = self._drafter(prompt_ids, documents, scope) if lookahead else None
            tokens = chooser.choose(logits[-1:], ids, DraftTree.root_only(ids[-1]))
            rec.prefill_seconds = time.perf_counter() - rec.started
            windowed = drafter.windowed() if drafter is not None else None
            while True:
                remaining = params.max_new_tokens - (len(ids) - len(prompt_ids))
                tokens, reason = truncate_step(tokens, eos, remaining)
                ids += tokens
                if drafter is not None:
                    drafter.observe(tokens)
                if reason is None and len(ids) >= window:
                    reason = "context_window"
                if reason is not None:
                    rec.finish(reason)
                yield tokens
                if reason is not None:
                    return
                # Room for the drafted tokens plus the model's own one, in the budget and the window.
                budget = min(self.config.decoding_length, remaining - len(tokens) - 1, window - len(ids) - 1)
                tokens, cache = self._step(ids, drafter, windowed, budget, chooser, cache, rec)
        finally:
            if drafter is not None:
                drafter.close()

    def _step(
        self,
        ids: list[int],
        drafter: MergedDrafter | None,
        windowed: WindowedDrafter | None,
        budget: int,
        chooser: TokenChooser,
        cache: Any,
        rec: StepRecorder,
    ) -> tuple[list[int], Any]:
        """2) Draft, forward the tree, choose per node, accept, keep the path's cache."""
        tree = DraftTree.root_only(ids[-1])
        if drafter is not None and budget > 0:
            proposed = drafter.propose(ids, budget)
            with self._lock:
                tree = self.planner.plan(proposed)
        side = self._side_rows(windowed, tree, len(ids))
        past = len(ids) - 1
        logits, cache = self.runner.forward_tree(tree, cache, past, side)
        accepted = accept(tree, chooser.choose(logits[: len(tree)], ids, tree))
        if windowed is not None and side is not None:
            windowed.observe_side(logits[len(tree) :].argmax(-1).tolist())
        if len(tree) > 1 or side is not None:
            keep_accepted(cache, past, len(tree) + len(side or ()), accepted.nodes)
        with self._lock:
            self.planner.learn(tree, accepted.nodes)
        rec.step(len(tree) - 1, len(accepted.tokens) - 1, tree.source)
        return accepted.tokens, cache

    @property
    def cost_curve(self) -> CostCurve:
        """Forward seconds by number of new tokens, measured once and cached on disk."""
        with self._lock:
            if self._cost_curve is None:
                cfg = self.config
                size = cfg.decoding_length + 1 + cfg.window_size * (cfg.ngram_size - 1)
                self._cost_curve = self.runner.cost_curve(size, self._cache_dir)
            return self._cost_curve

    def _side_rows(
        self, windowed: WindowedDrafter | None, tree: DraftTree, length: int
    ) -> SideRows | None:
        """The Jacobi window's rows for this forward, when there is one and it is worth it."""
        room = (self.context_window or 1 << 62) - length
        if windowed is None or self.config.window_size + self.config.ngram_size - 2 >= room:
            return None  # no window, or its furthest row would sit past the context window
        with self._lock:
            pays = self.planner.window_pays(len(tree))
        return windowed.side_rows() if pays else None
