"""One step of the batch as data: what the scheduler plans, what the executor returns, and
what each row's verification comes to.

`Rows.step` (`rag_lookahead.engine.rows`) reads as plan → execute → update, after vLLM's
``SchedulerOutput`` → ``ModelRunnerOutput`` → ``update_from_output``: a `StepPlan` (per row, a
draft to verify or the next chunk of its prompt), a `StepOutput` (per row, the logits the plan
reads, and the forward's seconds), and per row a `Verdict` (the tokens it accepted, or its
error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rag_lookahead.decoding.tree import DraftTree, StepDraft

__all__ = ["RowPlan", "Scored", "StepOutput", "StepPlan", "Verdict"]

# The chosen tokens' log probabilities, and per token its most likely (token, log probability).
Scored = tuple[list[float], list[list[tuple[int, float]]]]


@dataclass(frozen=True)
class RowPlan:
    """What one row forwards in a step: a draft to verify, or the next chunk of its prompt."""

    draft: StepDraft  # a prompt's chunk is a causal chain at the positions after what is cached
    prompt: bool = False  # a chunk of its prompt: every token is kept, none verified
    ends_prompt: bool = False  # the chunk ends the prompt: the logits at its last token are read

    @classmethod
    def prompt_chunk(cls, prompt_ids: Sequence[int], start: int, tokens: int) -> RowPlan:
        """The ``tokens`` of ``prompt_ids`` from ``start`` as a chain."""
        chain = DraftTree(tuple(prompt_ids[start : start + tokens]), tuple(range(-1, tokens - 1)))
        return cls(StepDraft(chain), prompt=True, ends_prompt=start + tokens == len(prompt_ids))


@dataclass(frozen=True)
class StepPlan:
    """One forward over every row of the batch, in row order."""

    rows: tuple[RowPlan, ...]

    @property
    def width(self) -> int:
        """The forward's tokens per row when every row is padded to the widest."""
        return max(len(row.draft) for row in self.rows)

    @property
    def tokens(self) -> int:
        """The forward's tokens when the rows lie side by side, unpadded (packed)."""
        return sum(len(row.draft) for row in self.rows)

    @property
    def prompts(self) -> bool:
        """Whether a prompt's chunk rides in this step."""
        return any(row.prompt for row in self.rows)

    def logit_positions(self) -> list[int] | None:
        """The positions (ascending) whose logits the update reads in every row, when a prompt's
        chunk widens the step past the drafts (``None``: all of them): every draft's nodes, and
        a prompt's last token."""
        if not self.prompts:
            return None
        drafts = max((len(row.draft) for row in self.rows if not row.prompt), default=0)
        ends = {len(row.draft) - 1 for row in self.rows if row.ends_prompt}
        return sorted(set(range(drafts)) | ends)


@dataclass(frozen=True)
class StepOutput:
    """What the executor returns for a `StepPlan`."""

    # Per row: [T, V] at a draft's T nodes (tree, then side rows), [1, V] at the last token of
    # a prompt its chunk ends, [0, V] for a prompt not yet done.
    logits: tuple[torch.Tensor, ...]
    seconds: float  # the forward's, for the pricing to learn from


@dataclass(frozen=True)
class Verdict:
    """What one row's step came to: the model's tokens to release, the draft nodes the cache
    keeps, what the release needs besides (side predictions, log probabilities), or the row's
    error. A failed row keeps only its root (the columns past it stay hidden) and ends."""

    tokens: list[int]
    nodes: list[int]  # the accepted path's nodes in the step's draft, root first
    side_predictions: list[int] = field(default_factory=list)  # the model's argmax at side rows
    scored: Scored | None = None  # when the call asks for log probabilities
    error: Exception | None = None

    @classmethod
    def failed(cls, error: Exception) -> Verdict:
        return cls([], [0], error=error)

    @classmethod
    def prompt_chunk(cls, row: RowPlan) -> Verdict:
        """A prompt's chunk: all of it kept, nothing released."""
        tokens = list(row.draft.tree.tokens)
        return cls(tokens, list(range(len(tokens))))
