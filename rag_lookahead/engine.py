"""The engine: the only place that runs the model.

Each step reads as five verbs: draft a tree, forward it over the KV cache in one pass, choose
the model's token at every node, accept the longest agreeing path, keep only that path in the
cache. The engine knows nothing about where drafts come from: drafters see token ids only.
"""

from __future__ import annotations

import inspect
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Sequence

import torch

from rag_lookahead.budget import AcceptanceModel, plan_draft
from rag_lookahead.cache import cache_kwarg, keep_accepted, new_tree_cache
from rag_lookahead.costs import CostCurve, cached_curve, curve_key, measure_curve
from rag_lookahead.config import GenerationParams, LookaheadConfig
from rag_lookahead.drafting.base import WindowedDrafter
from rag_lookahead.drafting.merge import MergedDrafter, build_drafter
from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.probe import sliding_window, tree_support_problem
from rag_lookahead.prompts import Prompt, encode_prompt
from rag_lookahead.scope import DocumentScope
from rag_lookahead.stats import FinishReason
from rag_lookahead.stream import Completion, StepRecorder, TextStream
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
        self.acceptance = AcceptanceModel()
        self._cost_curve = cost_curve
        self._cache_dir = cache_dir
        self._lock = threading.RLock()
        self._cache_arg = cache_kwarg(model)
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._tree_problem: str | None = None if self.config.mode != "off" else "mode is 'off'"
        self._probed = self.config.mode == "off"

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
        return next(self.model.parameters()).device

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
        other._lock = self._lock
        return other

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Drop-in for `model.generate`: see `rag_lookahead.hf_compat.generate`."""
        from rag_lookahead.hf_compat import generate

        return generate(self, input_ids, **kwargs)

    @property
    def tree_verification(self) -> bool:
        """Whether this model verifies drafts (else it decodes plainly, as warned once)."""
        self._ensure_probed()
        return self._tree_problem is None

    # ------------------------------------------------------------------ decoding

    def _check_length(self, prompt_ids: Sequence[int]) -> None:
        window = self.context_window
        if window is not None and len(prompt_ids) >= window:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens; the model's context window is {window}"
            )

    def _ensure_probed(self) -> None:
        with self._lock:
            if self._probed:
                return
            self._probed = True
            self._tree_problem = tree_support_problem(self.model, self._cache_arg)
            if self._tree_problem is not None:
                warnings.warn(
                    f"rag-lookahead: this model cannot verify draft trees ({self._tree_problem}); "
                    "decoding plainly, without lookahead. Outputs are unaffected.",
                    stacklevel=3,
                )

    def _drafter(
        self,
        prompt_ids: list[int],
        documents: list[str],
        params: GenerationParams,
        scope: DocumentScope | None,
    ) -> MergedDrafter | None:
        self._ensure_probed()
        if self._tree_problem is not None:
            return None
        window = sliding_window(self.model.config)
        longest = len(prompt_ids) + params.max_new_tokens + self.config.decoding_length
        longest += self.config.window_size + self.config.ngram_size
        if window is not None and longest > window:
            # One mask serves every layer, so a window's cut-off cannot be expressed in it.
            warnings.warn(
                f"rag-lookahead: this call may exceed the model's sliding attention window "
                f"({window} tokens); decoding it plainly, without lookahead.",
                stacklevel=4,
            )
            return None
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
        drafter = self._drafter(prompt_ids, documents, params, scope)
        try:
            yield from self._decode(prompt_ids, params, drafter, rec)
        finally:
            if drafter is not None:
                drafter.close()

    def _decode(
        self,
        prompt_ids: list[int],
        params: GenerationParams,
        drafter: MergedDrafter | None,
        rec: StepRecorder,
    ) -> Generator[list[int], None, None]:
        eos = set(self.eos_token_ids if params.eos_token_id is None else params.eos_token_id)
        window = self.context_window or 1 << 62
        chooser = TokenChooser(params, self.device)
        ids = list(prompt_ids)
        cache = new_tree_cache() if drafter is not None else None
        windowed = drafter.windowed() if drafter is not None else None

        # 1) Prefill: the prompt, and the first new token from its last position.
        logits, cache = self._forward(torch.tensor([ids]), cache, last_only=True)
        tokens = chooser.choose(logits[-1:], ids, DraftTree.root_only(ids[-1]))
        rec.prefill_seconds = time.perf_counter() - rec.started
        while True:
            remaining = params.max_new_tokens - (len(ids) - len(prompt_ids))
            tokens, reason = _truncate(tokens, eos, remaining)
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
            # 2) Draft, forward the tree, choose per node, accept, keep the path's cache.
            # Room for the drafted tokens plus the model's own one, in the budget and the window.
            budget = min(
                self.config.decoding_length, remaining - len(tokens) - 1, window - len(ids) - 1
            )
            tree = DraftTree.root_only(ids[-1])
            if drafter is not None and budget > 0:
                tree = self._plan(drafter.propose(ids, budget))
            side = self._side_rows(windowed, tree, room=window - len(ids))
            past = len(ids) - 1
            logits, cache = self._forward_tree(tree, cache, past, side)
            accepted = accept(tree, chooser.choose(logits[: len(tree)], ids, tree))
            if windowed is not None and side is not None:
                windowed.observe_side(logits[len(tree) :].argmax(-1).tolist())
            if len(tree) > 1 or side is not None:
                keep_accepted(cache, past, len(tree) + len(side or ()), accepted.nodes)
            if len(tree) > 1:
                with self._lock:
                    self.acceptance.update(tree, accepted.nodes)
            rec.step(len(tree) - 1, len(accepted.tokens) - 1, tree.source)
            tokens = accepted.tokens

    def _plan(self, tree: DraftTree) -> DraftTree:
        if self.config.mode != "auto" or len(tree) == 1:
            return tree
        with self._lock:
            return plan_draft(tree, self.acceptance, self.cost_curve)

    @property
    def cost_curve(self) -> CostCurve:
        """Forward seconds by number of new tokens, measured once and cached on disk."""
        with self._lock:
            if self._cost_curve is None:
                from rag_lookahead.models import default_cache_dir

                cfg = self.config
                size = cfg.decoding_length + 1 + cfg.window_size * (cfg.ngram_size - 1)
                key = curve_key(self.model, self.device, size)
                directory = (self._cache_dir or default_cache_dir()) / "costs"
                self._cost_curve = cached_curve(directory, key, lambda: measure_curve(self._forward_timer(), size))
            return self._cost_curve

    def _forward_timer(self) -> Callable[[int], float]:
        """Times one forward over k chained draft tokens after a cache of up to 256 tokens."""
        vocab = int(self.model.config.vocab_size)
        length = min(256, (self.context_window or 512) // 2)
        prompt = [(31 * i + 7) % vocab for i in range(length)]
        _, cache = self._forward(torch.tensor([prompt]), new_tree_cache(), last_only=True)

        def seconds(tokens: int) -> float:
            chain = tuple(prompt[i % length] for i in range(tokens))
            tree = DraftTree(chain, tuple(range(-1, tokens - 1)))
            start = time.perf_counter()
            self._forward_tree(tree, cache, len(prompt))
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            elapsed = time.perf_counter() - start
            cache.crop(-tokens)
            return elapsed

        return seconds

    def _side_rows(
        self, windowed: WindowedDrafter | None, tree: DraftTree, room: int
    ) -> SideRows | None:
        """The Jacobi window's rows for this forward, when there is one and it is worth it."""
        if windowed is None:
            return None
        cfg = self.config
        if cfg.window_size + cfg.ngram_size - 2 >= room:
            return None  # its furthest row would sit past the context window
        if cfg.mode == "auto":
            cost, rows = self.cost_curve, cfg.window_size * (cfg.ngram_size - 1)
            if cost(len(tree) + rows) > 1.05 * cost(len(tree)):
                return None  # only run it where it is nearly free (a GPU, not a CPU)
        return windowed.side_rows()

    def _forward_tree(
        self, tree: DraftTree, cache: Any, past: int, side: SideRows | None = None
    ) -> tuple[torch.Tensor, Any]:
        if len(tree) == 1 and side is None:  # plain decoding: the model's own causal path
            return self._forward(torch.tensor([tree.tokens]), cache)
        inputs = tree.inputs(past, self.device, self.model.dtype, side)
        return self._forward(
            inputs.input_ids,
            cache,
            position_ids=inputs.position_ids,
            attention_mask=inputs.attention_mask,
        )

    def _forward(
        self, input_ids: torch.Tensor, cache: Any, last_only: bool = False, **kwargs: Any
    ) -> tuple[torch.Tensor, Any]:
        """Logits ``[n, V]`` for ``input_ids`` ``[1, n]``, and the cache now holding them."""
        kwargs[self._cache_arg] = cache
        if last_only and self._logits_to_keep:
            kwargs["logits_to_keep"] = 1
        with self._lock, torch.inference_mode():
            out = self.model(input_ids=input_ids.to(self.device), use_cache=True, **kwargs)
        if cache is None:  # plain decoding lets the model build the cache it prefers
            cache = getattr(out, "cache", None)
            cache = cache if cache is not None else getattr(out, "past_key_values", None)
        return out.logits[0], cache


def _truncate(
    tokens: list[int], eos: set[int], remaining: int
) -> tuple[list[int], FinishReason | None]:
    """Cut a step's tokens after the first EOS or at the token budget."""
    for i, token in enumerate(tokens[:remaining]):
        if token in eos:
            return tokens[: i + 1], "eos"
    if len(tokens) >= remaining:
        return tokens[:remaining], "length"
    return tokens, None
