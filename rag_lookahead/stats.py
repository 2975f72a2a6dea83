"""Measurements returned by every generation call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DecodeStats", "FinishReason"]

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
        finish_reason: Why generation stopped.
    """

    prompt_tokens: int
    new_tokens: int
    steps: int
    accepted_per_step: tuple[int, ...]
    drafted_per_step: tuple[int, ...]
    draft_sources: tuple[str, ...]
    prefill_seconds: float
    seconds: float
    finish_reason: FinishReason

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
