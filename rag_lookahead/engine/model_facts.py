"""What a call needs to know of one model and its tokenizer, and the checks of its input.

The engine asks here for the model's vocabulary, end-of-sequence tokens and context window,
turns prompts into token ids, and checks every id a caller hands it against them before a
call starts, so that bad input is a clear error and never reaches the decoding loop.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from rag_lookahead.config import GenerationParams
from rag_lookahead.decoding.constraint import GrammarCompiler, GrammarState
from rag_lookahead.prompts import Prompt, SpecialText, check_chat_template_kwargs, encode_prompt
from rag_lookahead.streaming.stopping import Stopping
from rag_lookahead.structured.grammar import Grammar

__all__ = ["ModelFacts"]


class ModelFacts:
    """One model's and tokenizer's facts, and the checks of a call's token ids against them."""

    def __init__(self, model: Any, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.template_kwargs = MappingProxyType(check_chat_template_kwargs(chat_template_kwargs))
        self.grammars = GrammarCompiler(tokenizer, self.vocab_size)

    @property
    def vocab_size(self) -> int:
        """Token ids this model can take: its input embedding's rows."""
        embeddings = self.model.get_input_embeddings()
        rows = getattr(embeddings, "num_embeddings", None)
        return int(rows if rows is not None else self.model.config.vocab_size)

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

    def encode(
        self,
        prompt: Prompt,
        tools: Sequence[Mapping[str, Any]] | None,
        special_tokens_in_content: bool = False,
    ) -> list[int]:
        """``prompt``'s token ids (see `encode_prompt`), with ``tools`` rendered by the chat template."""
        return encode_prompt(
            self.tokenizer,
            prompt,
            self.template_kwargs,
            tools,
            special_tokens_in_content=special_tokens_in_content,
            special_text=self.special_text,
        )

    @functools.cached_property
    def special_text(self) -> SpecialText:
        """The tokenizer's special tokens as text spells them, found once (see `encode_prompt`)."""
        return SpecialText.of(self.tokenizer)

    def tokenize(self, text: str) -> list[int]:
        """A document's token ids, without special tokens, less any the model has no row for (a
        tokenizer's added tokens may lie past its embedding): drafted, such a token would end
        every call of the batch's forward, and the model never picks it anyway."""
        ids = list(self.tokenizer(text, add_special_tokens=False).input_ids)
        vocab = self.vocab_size
        if ids and not 0 <= min(ids) <= max(ids) < vocab:
            ids = [i for i in ids if 0 <= i < vocab]
        return ids

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """Refuse a prompt that fills the context window or holds ids outside the vocabulary."""
        limit = self.context_window
        if limit is not None and len(prompt_ids) >= limit:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens; the model's context window is {limit}"
            )
        vocab = self.vocab_size
        bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"the prompt holds token id {bad}, outside the model's {vocab}-token vocabulary")

    def call_eos(self, eos: tuple[int, ...] | None) -> tuple[int, ...]:
        """A call's end-of-sequence tokens: the model's unless ``eos`` (checked) replaces them."""
        if eos is None:
            return self.eos_token_ids
        vocab = self.vocab_size
        bad = next((t for t in eos if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"eos_token_id {bad} is outside the model's {vocab}-token vocabulary")
        return eos

    def check_logit_bias(self, logit_bias: tuple[tuple[int, float], ...]) -> None:
        """Refuse a ``logit_bias`` for a token id outside the vocabulary."""
        vocab = self.vocab_size
        bad = next((t for t, _ in logit_bias if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"logit_bias token id {bad} is outside the model's {vocab}-token vocabulary")

    def grammar_state(self, grammar: Grammar | None, eos: tuple[int, ...]) -> GrammarState | None:
        """A call's matcher for ``grammar`` ending on ``eos`` (none without a grammar)."""
        return None if grammar is None else self.grammars.state(grammar, eos, self.context_window)

    def budget_to_close(self, grammar: Grammar) -> int:
        """See `LookaheadEngine.budget_to_close`."""
        window = self.context_window or 1 << 16
        state = self.grammars.state(grammar.closing_in_budget(), self.eos_token_ids, window)
        closing = state.closing(window)
        if closing is None:
            raise ValueError("no completion of an empty answer within the context window was found")
        return len(closing)

    def stopping(self, params: GenerationParams, eos: tuple[int, ...], prompt_length: int) -> Stopping:
        """Where a call with ``params`` and ``eos`` stops, after a prompt of ``prompt_length``."""
        return Stopping(
            self.tokenizer,
            eos=eos,
            stop_strings=params.stop_strings,
            max_new_tokens=params.max_new_tokens,
            prompt_length=prompt_length,
            context_window=self.context_window,
        )
