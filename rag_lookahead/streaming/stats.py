"""Measurements returned by every generation call."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "UNDRAFTED_REASONS",
    "DecodeStats",
    "FinishReason",
    "PredictionMatch",
    "StepRecorder",
    "UndraftedReason",
]

FinishReason = Literal["eos", "stop_string", "length", "context_window", "abandoned"]
# Why a step verified no draft (`DecodeStats.undrafted_steps`).
UndraftedReason = Literal[
    "mode_off", "no_tree_verification", "beyond_max_model_len", "no_draft", "not_worth_it"
]
UNDRAFTED_REASONS: tuple[UndraftedReason, ...] = (
    "mode_off",
    "no_tree_verification",
    "beyond_max_model_len",
    "no_draft",
    "not_worth_it",
)
# The most bytes of a prediction's token masks (`PredictionMatch`) kept for reuse per call.
_MASKS_BYTES = 16 << 20


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
        accepted_prediction_tokens: The tokens of the call's ``prediction`` that appear in
            the answer (OpenAI's "tokens in the prediction that appeared in the completion"):
            the longest common subsequence of the prediction's tokens and the answer's (its
            ``new_tokens``), whatever drafted them, so at most ``new_tokens``.
        rejected_prediction_tokens: The prediction's other tokens, those that do not appear
            in the answer (an edit, or past where the answer ended): the two add up to the
            prediction's tokens. Unlike OpenAI's, they are not added to ``new_tokens`` (no
            one is billed here). Both are a function of the prediction and the answer alone:
            the same for every mode that gives the answer, streamed or not.
        undrafted_steps: The steps that verified no draft, counted by why (each an
            `UndraftedReason`; a reason with no step is left out): ``"mode_off"``, the engine
            decodes plainly; ``"no_tree_verification"``, the model cannot verify drafts (it
            decodes plainly, `LookaheadEngine.tree_verification`); ``"beyond_max_model_len"``,
            the call is longer than a static step's slots (`LookaheadConfig.max_model_len`)
            and decodes plainly, alone; ``"no_draft"``, there was
            nothing to verify (no match in the prompt, the documents or past outputs, or no
            room left for a draft); ``"not_worth_it"``, ``mode="auto"`` judged the draft's
            expected tokens not worth the wider forward (by its chances of acceptance, learned,
            against the cost curve as the steps calibrate it).
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
    undrafted_steps: Mapping[str, int] = field(default_factory=dict, hash=False)

    @property
    def drafting_off_reason(self) -> str | None:
        """Why this call drafted on no step at all: the reason most of its steps give
        (`undrafted_steps`); ``None`` where any step verified a draft, or with no steps."""
        if not self.steps or any(self.drafted_per_step) or not self.undrafted_steps:
            return None
        return max(self.undrafted_steps.items(), key=lambda item: item[1])[0]

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
            "undrafted_steps": dict(self.undrafted_steps),
            "drafting_off_reason": self.drafting_off_reason,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_step": self.tokens_per_step,
            "acceptance_rate": self.acceptance_rate,
        }


class PredictionMatch:
    """How many of a prediction's tokens an answer holds, in order: the length of the longest
    common subsequence of the two, kept up as the answer's tokens come (`extend`).

    Bit-parallel (Allison and Dix; Hyyrö): a row of one bit per prediction token, a bit
    cleared for each token matched, takes a few big-integer operations per answer token, so a
    long prediction costs each token its length over the machine word, not its length.
    """

    def __init__(self, prediction: Sequence[int]) -> None:
        self.size = len(prediction)
        self._positions: dict[int, list[int]] = {}
        for index, token in enumerate(prediction):
            self._positions.setdefault(token, []).append(index)
        self._masks: dict[int, int] = {}
        self._masked_bytes = 0
        self._full = (1 << self.size) - 1
        self._row = self._full

    @property
    def matched(self) -> int:
        """The prediction's tokens that appear in the answer so far."""
        return self.size - self._row.bit_count()

    def extend(self, tokens: Sequence[int]) -> None:
        """The answer's next ``tokens``."""
        row = self._row
        for token in tokens:
            low = row & self._mask(token)
            row = ((row + low) | (row - low)) & self._full
        self._row = row  # one assignment: a reader in another thread sees a whole row

    def _mask(self, token: int) -> int:
        """The prediction's positions holding ``token``, as bits."""
        mask = self._masks.get(token)
        if mask is not None:
            return mask
        positions = self._positions.get(token, ())
        bits = bytearray((self.size + 7) // 8 if positions else 0)
        for index in positions:
            bits[index >> 3] |= 1 << (index & 7)
        mask = int.from_bytes(bits, "little")
        # Kept while they fit: the answer's distinct tokens times a long prediction's bits
        # could otherwise grow past what the call itself holds.
        if self._masked_bytes + len(bits) <= _MASKS_BYTES:
            self._masks[token] = mask
            self._masked_bytes += len(bits)
        return mask


@dataclass
class StepRecorder:
    """One call's measurements as it runs, frozen into `DecodeStats` on demand.

    Only the engine's decoding loop writes it; streams and adapters read `stats`. A call with
    a prediction counts its tokens in the answer as the answer's tokens are released
    (`released`); an engine that reads the counts off a server sets them instead.
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
    prediction: PredictionMatch | None = None  # the call's prediction, if it has one
    # Why no step of the call drafts, where known before its first (its engine's mode, its model).
    drafting_off: UndraftedReason | None = None
    # Why the next step verifies no draft, as its plan found (`plan`).
    planned: UndraftedReason | None = None
    undrafted: dict[str, int] = field(default_factory=dict)  # steps by `UndraftedReason`

    def plan(self, reason: UndraftedReason | None) -> None:
        """The next step verifies no draft for ``reason`` (``None``: it verifies one)."""
        self.planned = reason

    def step(self, drafted: int, accepted: int, source: str) -> None:
        self.drafted.append(drafted)
        self.accepted.append(accepted)
        self.sources.append(source)
        if not drafted:
            reason = self.drafting_off or self.planned or "no_draft"
            self.undrafted[reason] = self.undrafted.get(reason, 0) + 1
        self.planned = None

    def released(self, token_ids: Sequence[int]) -> None:
        """These tokens reached the answer (a step's, less what its stopping cut)."""
        self.new_tokens += len(token_ids)
        if self.prediction is not None:
            self.prediction.extend(token_ids)

    def finish(self, reason: FinishReason) -> None:
        """Record why generation ended; the first reason stands."""
        if self.finish_reason is None:
            self.finish_reason = reason
            self.ended = time.perf_counter()

    def stats(self) -> DecodeStats:
        end = self.ended if self.ended is not None else time.perf_counter()
        accepted, rejected = self.accepted_prediction, self.rejected_prediction
        if self.prediction is not None:
            accepted = self.prediction.matched
            rejected = self.prediction.size - accepted
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
            accepted_prediction_tokens=accepted,
            rejected_prediction_tokens=rejected,
            undrafted_steps=dict(self.undrafted),
        )
