"""The engine: the public calls, each handed to the `Scheduler` that decodes all of them.

Each step reads as five verbs: draft, forward the drafts of every running call in one pass
over the KV cache, choose the model's token at every node, accept the longest agreeing path,
keep only that path in the cache. The `ModelRunner` is the only thing that runs the model (on
the `Backend` the tuning wing chose for it), and
the engine knows nothing about where drafts come from: drafters see token ids only.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rag_lookahead.config import GenerationParams, LookaheadConfig, check_variant
from rag_lookahead.decoding.verify import TokenChooser
from rag_lookahead.drafting.compose import DrafterBuild, call_drafter
from rag_lookahead.drafting.protocol import Drafter
from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.engine.model_facts import ModelFacts
from rag_lookahead.engine.pricing import prepare_costs
from rag_lookahead.engine.request import Call, Decoder
from rag_lookahead.engine.scheduler import Scheduler
from rag_lookahead.engine.scope import DocumentScope, document_texts
from rag_lookahead.engine.scoring import PromptLogprobs, prompt_logprobs
from rag_lookahead.interface import EngineBase, check_scope
from rag_lookahead.loading import LoadKeywords, LoadOptions
from rag_lookahead.models import default_cache_dir
from rag_lookahead.planning.costs import CostCurve, CostModel
from rag_lookahead.planning.planner import StepPlanner
from rag_lookahead.prompts import Prompt
from rag_lookahead.runtime.backend import Backend
from rag_lookahead.runtime.threads import ModelThread
from rag_lookahead.streaming.stats import PredictionMatch, StepRecorder
from rag_lookahead.streaming.stream import TextStream
from rag_lookahead.structured.grammar import Grammar
from rag_lookahead.tuning.step_choice import StepSettings
from rag_lookahead.tuning.tuner import ModelTuning

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["LookaheadEngine"]

# Draft nodes learned between two writes of the acceptance statistics to disk.
_SAVE_EVERY = 256


class LookaheadEngine(EngineBase):
    """Lossless lookahead decoding for a Hugging Face decoder-only model.

    The engine owns a token trie shared by all calls: each call's prompt and documents are
    inserted as branches owned by that call and eliminated when it ends, while the model's own
    outputs stay (pruned under the node cap) and help later calls. Calls from several threads
    or tasks decode together: up to ``config.max_batch_size`` of them share each forward.
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
        chat_template_kwargs: Mapping[str, Any] | None = None,
        progress: bool = False,
        model_thread: ModelThread | None = None,
    ) -> None:
        """Wrap ``model`` and ``tokenizer``.

        Args:
            config: Drafting settings (`LookaheadConfig`).
            trie: A trie to share or reuse (e.g. `TokenTrie.load`); a new one by default. Its
                shape (``max_query_length``, ``branch_length``, its node cap) is the engine's,
                in place of the config's: ``engine.config`` reports it.
            cost_curve: Forward costs by size, for ``mode="auto"``, planned with as given (not
                calibrated by the steps; one marked ``loaded``, timed while other work shared
                the cores, is calibrated and its shape doubted, `CostModel.given`) until
                `measure_costs` reads a curve back; when not given, the first call that needs
                it runs `measure_costs`.
            cache_dir: Where measured cost curves and acceptance statistics are kept (default:
                `default_cache_dir`).
            chat_template_kwargs: Variables for the chat template of every chat prompt, e.g.
                ``{"enable_thinking": False}`` for Qwen3 (see `encode_prompt`).
            progress: Show a progress bar on standard error, when it is a terminal, while the
                kernels are timed, the forwards probed and the costs measured (see
                `rag_lookahead.progress`).
            model_thread: The thread every forward runs in (`ModelThread`): by default the
                process's shared one, where `from_pretrained` loads its model. On a CPU every
                thread that has run torch work holds an OpenMP team that slows the others'
                forwards (see `rag_lookahead.runtime.threads`): load your own model inside
                ``ModelThread.shared().call(...)`` where you can.
        """
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError("rag-lookahead needs a decoder-only (causal) language model")
        self.model = model
        self.tokenizer = tokenizer
        self._facts = ModelFacts(model, tokenizer, chat_template_kwargs)
        self.config = config or LookaheadConfig()
        if trie is not None:  # (its shape is the engine's: the config reports what runs)
            self.config = _shaped_by(self.config, trie)
        self.trie = trie if trie is not None else _new_trie(self.config)  # (an empty one is falsy)
        largest = self.trie.largest_token()
        if largest >= self.vocab_size:
            raise ValueError(
                f"the trie holds token id {largest}, outside this model's "
                f"{self.vocab_size}-token vocabulary: it was built for another tokenizer"
            )
        self._tuning = ModelTuning(
            model,
            self.config.cpu_linear,
            self.config.direct_forward,
            cache_dir or default_cache_dir(),
            model_thread,
            progress,
            StepSettings(self.config.step, self.config.max_model_len, self.config.max_batch_size),
        )
        self.runner = self._tuning.runner
        # What its forwards cost, once measured (or given): shared by its variants' planners.
        self.costs = CostModel.given(cost_curve)
        self.planner = StepPlanner(self.config, self.costs)
        self.scheduler = _new_scheduler(self._tuning, self.costs, self.config)
        self._cache_dir = cache_dir
        self._progress = progress

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | None = None,
        *,
        config: LookaheadConfig | None = None,
        load: LoadOptions | None = None,
        **loading: Unpack[LoadKeywords],
    ) -> LookaheadEngine:
        """Load a model offline and wrap it, with drafting settings ``config``.

        How it loads is ``load`` (`LoadOptions`), or the same options given one by one:
        ``name_or_path`` (`LoadOptions.model`: ``None`` for the default SmolLM2-135M-Instruct,
        a built-in model's name such as ``"gemma3-270m"``, a local directory or a hub id
        already in the local cache), ``device``, ``dtype``, ``trust_remote_code``,
        ``model_kwargs``, ``tokenizer_kwargs``, ``chat_template_kwargs`` and ``progress``.
        """
        from rag_lookahead.models import load_model

        options = LoadOptions.of(load, name_or_path, **loading)  # checked before a long load
        # Loaded where its forwards will run: the process's one thread that runs torch work.
        model, tokenizer = ModelThread.shared().call(
            functools.partial(
                load_model,
                options.model,
                device=options.device,
                dtype=options.dtype,
                trust_remote_code=options.trust_remote_code,
                model_kwargs=options.model_kwargs,
                tokenizer_kwargs=options.tokenizer_kwargs,
                progress=options.progress,
            )
        )
        return cls(
            model,
            tokenizer,
            config,
            chat_template_kwargs=options.chat_template_kwargs,
            progress=options.progress,
        )

    def with_config(self, config: LookaheadConfig) -> LookaheadEngine:
        """This engine with other per-call settings (`LookaheadConfig`'s lifetimes): the same
        model, runner, trie, batches and costs.

        Variants serve threads side by side: their calls join the same batches, and draft
        from (and add outputs to) the same trie. A ``config`` that changes a per-engine setting
        (the trie's shape, the batches and prefix cache, the forwards) is refused with a
        `ValueError` naming it: another value needs another `LookaheadEngine`. Derive the
        variant's config from this one's, ``dataclasses.replace(engine.config, mode="trie")``.
        """
        other = copy.copy(self)
        other.config = check_variant(self.config, config)
        other.planner = self.planner.with_config(config)
        return other

    @property
    def supports_plain(self) -> bool:
        """Always: `plain` is this engine without drafts."""
        return True

    def plain(self) -> LookaheadEngine:
        """This engine decoding plainly (``mode="off"``), the reference: see `with_config`."""
        return self.with_config(replace(self.config, mode="off"))

    @property
    def cache_dir(self) -> Path | None:
        """Where this engine keeps measured cost curves and acceptance statistics (``None``:
        `default_cache_dir`)."""
        return self._cache_dir

    @property
    def chat_template_kwargs(self) -> Mapping[str, Any]:
        """The chat template's variables for every chat prompt (read-only)."""
        return self._facts.template_kwargs

    def encode(
        self,
        prompt: Prompt,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        special_tokens_in_content: bool = False,
    ) -> list[int]:
        """``prompt``'s token ids, as a call would see them (see `encode_prompt`), with ``tools``
        rendered by the chat template. Chat messages' special-token text is tokenized as text;
        ``special_tokens_in_content=True`` gives the ids with it parsed as the template's markup,
        to pass to a call as token ids."""
        return self._facts.encode(prompt, tools, special_tokens_in_content)

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def backend(self) -> Backend:
        """What this engine's forwards run on, and where each choice came from: the linear
        kernels by a forward's tokens, the direct forward or the model's own, batched steps
        packed or padded, whether the model verifies trees (`Backend`; ``print`` it, or
        `Backend.as_dict`). Chosen when the engine is built, again after the model's
        structure changed (`model_changed`)."""
        return self.runner.backend

    @property
    def vocab_size(self) -> int:
        """Token ids this model can take: its input embedding's rows."""
        return self._facts.vocab_size

    @property
    def context_window(self) -> int | None:
        return self._facts.context_window

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The model's end-of-sequence tokens (generation config first, then tokenizer)."""
        return self._facts.eos_token_ids

    @property
    def model_name(self) -> str:
        """The model's name or path as loaded (its class name when it has none)."""
        return str(getattr(self.model, "name_or_path", "") or type(self.model).__name__)

    @property
    def chat(self) -> bool:
        """Whether the tokenizer has a chat template to format chat messages with."""
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def drafts_from_documents(self) -> bool:
        """Whether documents reach the drafts: unless this engine decodes plainly."""
        return self.config.mode != "off"

    @property
    def cost_curve(self) -> CostCurve | None:
        """The forward cost curve ``mode="auto"`` plans with, once measured or given."""
        return self.planner.cost_curve

    def budget_to_close(self, grammar: Grammar) -> int:
        """The ``max_new_tokens`` that makes sure of a complete answer under ``grammar`` when it
        closes in budget (`Grammar.closes_in_budget`): the tokens of the completion such a
        grammar forces on an empty answer, its end-of-sequence token included. A smaller budget
        may still end complete (the model's own values can be shorter), or be cut."""
        return self._facts.budget_to_close(grammar)

    def measure_costs(self, *, remeasure: bool = False, batches: bool = True) -> CostCurve:
        """Time forwards of every draft size this config may verify, alone and in batches of
        2, 4, 8... rows (or read them from the on-disk cache), and plan with them from now on.
        Takes seconds on a CPU, once per model, device, dtype and thread count; ``remeasure``
        times them again and replaces the cached ones (after a measurement on a busy machine,
        say). On a CPU the forwards run calibrate the curve, by draft size and context; a
        cached curve they find too slow (or steeper than they are) is forgotten on disk, for the
        next process to measure, rather than measured while calls wait (`CurveCheck`). Also takes
        the acceptance statistics stored by earlier processes (the model was probed when the
        engine was built): everything a first answer would otherwise pay for. The forwards run in the
        model's thread (`ModelThread`), between the steps of running calls. Without ``batches``
        only one row's forwards are timed (for a process that answers one call at a time: a
        batch is then priced by one row's curve over its tokens, as its steps calibrate it)."""
        args = (self.runner, self.costs, self.planner, self.config, self._cache_dir)
        prepare = functools.partial(
            prepare_costs, *args, remeasure=remeasure, progress=self._progress, batches=batches
        )
        return self.runner.thread.call(prepare)

    def measure_ahead(self, *, remeasure: bool = False, batches: bool = True) -> None:
        """Measure what this engine's first drafting call would otherwise measure (`measure_costs`;
        timed again with ``remeasure``; batches' costs only with ``batches``), so that no call
        waits for it: nothing unless ``mode="auto"`` on a model that verifies drafts, or once
        measured."""
        if self.config.mode == "auto" and self.tree_verification and (remeasure or self.cost_curve is None):
            self.measure_costs(remeasure=remeasure, batches=batches)

    # ------------------------------------------------------------------ public calls

    def stream(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        documents: Iterable[str] = (),
        scope: DocumentScope | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        drafter: Drafter | None = None,
        prediction: str | None = None,
        **overrides: Any,
    ) -> TextStream:
        """Generate for ``prompt``, yielding new text as it is decided.

        Args:
            prompt: Plain text, token ids, or chat messages (formatted by the chat template).
            params: Token choice and stopping; keyword ``overrides`` replace single fields,
                e.g. ``max_new_tokens=64``, or ``grammar=Grammar.json_schema(schema)`` to keep
                every token within a grammar (the answer then ends, at an end-of-sequence
                token, only where the grammar is complete).
            documents: Texts this call may draft from besides its prompt (retrieved passages).
            scope: A `DocumentScope` (from `scope`) whose documents this call may draft from.
            tools: OpenAI-style function tools the chat template renders into the prompt (see
                `rag_lookahead.structured.tools`); parse the reply with the model's `ToolFormat`.
            drafter: Your own `Drafter` for this call, in place of the trie's and Jacobi's (the
                documents then reach the drafts only through it); the engine closes it when the
                call ends. Its drafts are verified like any other, so the output is the same.
            prediction: Text the answer is expected to copy (OpenAI's Predicted Outputs: the
                file being edited, the document being rewritten): a document with priority,
                drafted first wherever the answer's last tokens match it and trusted by the
                planner from the start (see `rag_lookahead.drafting.prediction`); the answer is
                the one plain decoding gives. The stats count its tokens that appear in the
                answer and those that do not, as OpenAI does
                (`DecodeStats.accepted_prediction_tokens`). An engine that decodes plainly
                (``mode="off"``) drafts nothing from it, and counts it alike.
        """
        if drafter is not None and self.config.mode == "off":
            raise ValueError("a drafter needs an engine that drafts: this one's mode is 'off'")
        params = (params or GenerationParams()).with_overrides(**overrides)
        texts = document_texts(documents)
        if prediction is not None and not isinstance(prediction, str):
            raise TypeError(f"prediction must be a string, got {type(prediction).__name__}")
        prompt_ids = self.encode(prompt, tools=tools)
        self._facts.check_prompt(prompt_ids)
        check_scope(scope, self)
        eos = self._facts.call_eos(params.eos_token_id)
        self._facts.check_logit_bias(params.logit_bias)
        grammar = self._facts.grammar_state(params.grammar, eos)
        self._tuning.refresh()  # the model as it is now: see `model_changed`
        batchable = self._batchable()
        drafts = batchable and self.config.mode != "off"
        if drafts and self.config.mode == "auto":
            self.measure_ahead()
            self.costs.retire_contradicted()  # for the next process to measure; only plans change
        self.planner.save_acceptance(every=_SAVE_EVERY)  # here, off the decoding loop
        # Tokenized here, in the caller's thread, not in the loop while every other row waits.
        sequences = [prompt_ids, *(self._tokenize(t) for t in texts)] if drafts and drafter is None else []
        predicted = self._tokenize(prediction) if prediction else []
        # Counted in every mode, as OpenAI counts it: the prediction's tokens in the answer.
        recorder = StepRecorder(len(prompt_ids), prediction=PredictionMatch(predicted) if predicted else None)
        if not drafts:  # why: for its stats' ``undrafted_steps``
            recorder.drafting_off = "no_tree_verification" if not batchable else "mode_off"
        # The loop takes these texts in: long ones a slice at a time before the prefill.
        build = DrafterBuild(self.config, self.trie, sequences, scope, predicted) if sequences else None
        call = Call(
            prompt_ids=prompt_ids,
            recorder=recorder,
            batchable=batchable,
            top_logprobs=params.top_logprobs if params.logprobs else None,
        )
        decoder = Decoder(
            config=self.config,
            planner=self.planner,
            chooser=TokenChooser(params),
            stopping=self._facts.stopping(params, eos, len(prompt_ids)),
            # The trie takes the call's texts once its prefill is under way (long ones before).
            make_drafter=functools.partial(
                call_drafter,
                self.config,
                self.trie,
                sequences,
                scope,
                grammar,
                drafter,
                predicted,
                vocab_size=self.vocab_size,
                build=build,
            )
            if drafts
            else None,
            prepare=build,
            grammar=grammar,
        )
        steps = self.scheduler.chunks(call)
        stream = TextStream(steps, call.recorder, cancel=functools.partial(self.scheduler.cancel, call))
        self.scheduler.submit(call, decoder)
        return stream

    def scope(self, documents: Iterable[str] = ()) -> DocumentScope:
        """Documents for several calls: insert them now (in slices, in the model's thread: the
        running calls step in between), eliminate them when the scope closes.

        Use it as ``with engine.scope(passages) as docs: engine.complete(q, scope=docs)``;
        calls not given the scope never draft from its documents.
        """
        scope = DocumentScope(self.trie, self._tokenize, self.runner.thread.call)
        scope.add(documents)
        return scope

    def prompt_logprobs(self, prompt: Prompt, top_logprobs: int = 0) -> PromptLogprobs:
        """``prompt``'s tokens scored by the model: each token's log probability given those
        before it (the first has none), with the ``top_logprobs`` most likely tokens at each
        position (0 to 20), as OpenAI's ``echo`` with ``logprobs`` reports them (see
        `rag_lookahead.engine.scoring`). The forwards run in the model's thread (`ModelThread`),
        between the steps of running calls."""
        ids = self.encode(prompt)
        self._facts.check_prompt(ids)
        self._tuning.refresh()
        text = functools.cache(lambda token: str(self.tokenizer.decode([token])))  # once per call
        return self.runner.thread.call(
            functools.partial(prompt_logprobs, self.runner, text, ids, top_logprobs)
        )

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Drop-in for `model.generate`: see `rag_lookahead.engine.generate.generate`."""
        from rag_lookahead.engine.generate import generate

        return generate(self, input_ids, **kwargs)

    def model_changed(self) -> None:
        """Say that the model changed where torch records nothing: a write through a tensor's
        ``.data`` (``weight.data.mul_(2)``, ``weight.data.copy_(other)``), which bumps no
        version counter and keeps the storage. Every other change (weights loaded, scaled,
        stepped or replaced; a hook; a layer replaced or wrapped; an adapter injected, switched
        or merged; train() and eval()) each call finds by itself. Either way, the prompts kept
        for reuse are dropped and what was derived from the model's modules (the reordered
        weights, the direct forward, the tree probe) is derived again, into a new `backend`;
        calls running meanwhile are the caller's race, and only calls started afterwards are
        sure to see the change."""
        self._tuning.refresh(untracked=True)

    @property
    def tree_verification(self) -> bool:
        """Whether this model verifies drafts (else it decodes plainly, as warned once)."""
        return self._tree_problem() is None

    def _tree_problem(self) -> str | None:
        return "mode is 'off'" if self.config.mode == "off" else self._tuning.tree_problem()

    # ------------------------------------------------------------------ decoding

    def _batchable(self) -> bool:
        """Whether calls may share the batch (and draft): the model verifies trees. Else each
        decodes plainly, alone."""
        return self._tuning.tree_problem() is None

    def _tokenize(self, text: str) -> list[int]:
        return self._facts.tokenize(text)


def _new_scheduler(tuning: ModelTuning, costs: CostModel, config: LookaheadConfig) -> Scheduler:
    return Scheduler(
        tuning,
        costs,
        config.max_batch_size,
        config.max_tokens_per_forward,
        config.max_prefill_tokens_per_step,
        config.prefix_cache_mb << 20,
    )


def _shaped_by(config: LookaheadConfig, trie: TokenTrie) -> LookaheadConfig:
    """``config`` with a given trie's shape in place of its own (validated again: a
    ``min_query_length`` past the trie's ``max_query_length`` is refused)."""
    return replace(
        config,
        max_query_length=trie.max_query_length,
        branch_length=trie.branch_length,
        max_trie_nodes=trie.max_nodes,
    )


def _new_trie(config: LookaheadConfig) -> TokenTrie:
    return TokenTrie(
        max_query_length=config.max_query_length,
        branch_length=config.branch_length,
        max_nodes=config.max_trie_nodes,
    )
