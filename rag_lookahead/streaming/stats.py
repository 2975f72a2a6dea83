"""Measurements returned by every generation call."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["DecodeStats", "FinishReason", "StepRecorder"]

FinishReason = Literal["eos", "stop_string", "length", "context_window", "abandoned"]


@dataclass(frozen=True)
class DecodeStats:
    """What one generation did.

    A *step* is one forward pass after the prefill. Each step emits the draft tokens the model
    agreed with plus one token of its own, so ``tokens_per_step >= 1``; the first new token
    comes from the prefill and belongs to no step.

    Attributes:
        prompt_tokens: Length of the prompt.
        new_tokens: Tokens generated (the prefill's token included).
        steps: Forward passes after the prefill.
        accepted_per_step: Draft tokens accepted at each step (0 when the draft missed).
        drafted_per_step: Draft tokens verified at each step (the tree size minus its root).
        draft_sources: Where each step's draft came from (``"trie"``, or ``"none"``).
        prefill_seconds: Time to the first new token.
        seconds: Wall time of the whole call.
        finish_reason: Why generation stopped; ``None`` while the call is still running.
        cached_prompt_tokens: Leading prompt tokens whose KV entries were reused from an
            earlier prompt instead of prefilled (see ``LookaheadConfig.prefix_cache_mb``).
        accepted_prediction_tokens: Draft tokens from the call's ``prediction`` (nodes whose
            longest match lay in it) that the model verified and the answer kept (OpenAI's
            "tokens in the prediction that appeared in the completion"): the tokens the
            prediction saved a forward for.
        rejected_prediction_tokens: Draft tokens from the ``prediction`` that were verified
            and are not in the answer: the model chose otherwise, at that node or above it, or
            the answer ended before them. Counted at each verification, as OpenAI counts
            them, so a prediction token drafted at several steps may count more than once;
            unlike OpenAI's, they are not added to ``new_tokens``.
    """

    prompt_tokens: int
    new_tokens: int
    steps: int
    accepted_per_step: tuple[int, ...]
    drafted_per_step: tuple[int, ...]
    draft_sources: tuple[str, ...]
    prefill_seconds: float
    seconds: float
    finish_reason: FinishReason | None
    cached_prompt_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per forward pass after the prefill (1.0 is plain decoding)."""
        return (self.new_tokens - 1) / self.steps if self.steps else 1.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens, across all steps."""
        drafted = sum(self.drafted_per_step)
        return sum(self.accepted_per_step) / drafted if drafted else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Every field and derived rate as plain JSON-ready values (for response metadata)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "accepted_per_step": list(self.accepted_per_step),
            "drafted_per_step": list(self.drafted_per_step),
            "draft_sources": list(self.draft_sources),
            "prefill_seconds": self.prefill_seconds,
            "seconds": self.seconds,
            "finish_reason": self.finish_reason,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "accepted_prediction_tokens": self.accepted_prediction_tokens,
            "rejected_prediction_tokens": self.rejected_prediction_tokens,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_step": self.tokens_per_step,
            "acceptance_rate": self.acceptance_rate,
        }


@dataclass
class StepRecorder:
    """One call's measurements as it runs, frozen into `DecodeStats` on demand.

    Only the engine's decoding loop writes it; streams and adapters read `stats`. A step that
    verified prediction nodes says which of its accepted tokens came from the prediction
    (`predicted`); the tokens released next (`released`) settle them as accepted, and those
    the answer ended before as rejected.
    """

    prompt_tokens: int
    started: float = field(default_factory=time.perf_counter)
    prefill_seconds: float = 0.0
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    new_tokens: int = 0
    finish_reason: FinishReason | None = None
    ended: float | None = None
    cached_prompt_tokens: int = 0
    accepted_prediction: int = 0
    rejected_prediction: int = 0
    # The last step's accepted draft tokens: whether each came from the prediction.
    _predicted: tuple[bool, ...] = field(default=(), init=False, repr=False)

    def step(self, drafted: int, accepted: int, source: str) -> None:
        self.drafted.append(drafted)
        self.accepted.append(accepted)
        self.sources.append(source)

    def predicted(self, path: tuple[bool, ...], rejected: int) -> None:
        """This step's accepted draft tokens, in order: whether each came from the prediction;
        and how many of the prediction's verified nodes the model did not accept."""
        self._predicted = path
        self.rejected_prediction += rejected

    def released(self, tokens: int) -> None:
        """The first ``tokens`` of the step's tokens reached the answer (the rest were cut)."""
        self.new_tokens += tokens
        if self._predicted:
            kept = sum(self._predicted[:tokens])
            self.accepted_prediction += kept
            self.rejected_prediction += sum(self._predicted) - kept
            self._predicted = ()

    def finish(self, reason: FinishReason) -> None:
        """Record why generation ended; the first reason stands."""
        if self.finish_reason is None:
            self.finish_reason = reason
            self.ended = time.perf_counter()

    def stats(self) -> DecodeStats:
        end = self.ended if self.ended is not None else time.perf_counter()
        return DecodeStats(
            prompt_tokens=self.prompt_tokens,
            new_tokens=self.new_tokens,
            steps=len(self.accepted),
            accepted_per_step=tuple(self.accepted),
            drafted_per_step=tuple(self.drafted),
            draft_sources=tuple(self.sources),
            prefill_seconds=self.prefill_seconds,
            seconds=end - self.started,
            finish_reason=self.finish_reason,
            cached_prompt_tokens=self.cached_prompt_tokens,
            accepted_prediction_tokens=self.accepted_prediction,
            rejected_prediction_tokens=self.rejected_prediction,
        )
