"""How a question's sources are chosen: the retrieval modes and `RetrievalConfig`.

Kept apart from the index and the pipeline, which need numpy, FAISS and torch: the command
line reads these defaults for its help before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["RETRIEVAL_MODES", "RetrievalConfig", "RetrievalMode", "check_mode"]

RetrievalMode = Literal["dense", "keyword", "hybrid"]
RETRIEVAL_MODES: tuple[RetrievalMode, ...] = ("dense", "keyword", "hybrid")


def check_mode(mode: object) -> RetrievalMode:
    """`mode` if it is a retrieval mode, else a clear error."""
    for known in RETRIEVAL_MODES:
        if mode == known:
            return known
    raise ValueError(f"retrieval mode must be one of {', '.join(RETRIEVAL_MODES)}; got {mode!r}")


@dataclass(frozen=True)
class RetrievalConfig:
    """How a question's sources are chosen.

    Attributes:
        top_k: Chunks retrieved per question (all of them feed the drafts).
        min_score: Chunks less similar than this (cosine) are not relevant. Keyword mode does
            not embed the question, so there a chunk is relevant when it shares a word with it.
        max_context_tokens: Token budget of the prompt; ``None``: the model's context window
            minus the answer's ``max_new_tokens``. Sources that do not fit are cut, with a note.
        mode: ``"hybrid"`` (keyword and dense rankings fused; it found the gold passage at
            least as often as dense search on every benchmark set, see the README),
            ``"dense"`` or ``"keyword"``.
    """

    top_k: int = 4
    min_score: float = 0.2
    max_context_tokens: int | None = None
    mode: RetrievalMode = "hybrid"

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {self.top_k!r}")
        if not -1.0 <= self.min_score <= 1.0:
            raise ValueError(f"min_score is a cosine similarity in [-1, 1], got {self.min_score!r}")
        if self.max_context_tokens is not None and self.max_context_tokens < 16:
            raise ValueError(f"max_context_tokens must be at least 16, got {self.max_context_tokens!r}")
