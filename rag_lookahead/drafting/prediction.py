"""A call's predicted output (OpenAI's Predicted Outputs): text its answer is expected to copy.

A prediction (the file being edited, the document being rewritten) is a document with
priority. Where the call drafts from its own text (``draft_policy="suffix"``), it is one more
text of the call's `SuffixDrafter`, preferred where a match in it is as long as the longest
elsewhere; otherwise (the trie's policy, ``mode="jacobi"``, a caller's own drafter) a
`PredictionDrafter` of the prediction alone comes first, its branches taking the step's budget
before any other drafter's (`rag_lookahead.drafting.compose.call_drafter`). Either way its nodes'
sources start with ``PREDICTION_LABEL``: the planner learns apart from documents' drafts how
much of them the model accepts (starting from trust, see `AcceptanceModel`). The call's stats
count the prediction's tokens that appear in the answer, whatever drafted them
(`rag_lookahead.streaming.stats.PredictionMatch`).
"""

from __future__ import annotations

from collections.abc import Sequence

from rag_lookahead.decoding.tree import PREDICTION_LABEL
from rag_lookahead.drafting.suffix import SuffixDrafter, SuffixRule

__all__ = ["PREDICTION_LABEL", "PredictionDrafter"]

# A long copy drafts as deep as the step's budget lets it. Every occurrence of the context's
# last token is looked at (up to a long file's worth): the default scan window would lose the
# place in a prediction whose common tokens occur more often than it holds.
_RULE = SuffixRule(max_depth=1024, max_scan=1 << 16)


class PredictionDrafter(SuffixDrafter):
    """Drafts what follows the context's longest match in the prediction's token ids.

    Unlike a call's `SuffixDrafter`, it never adds the call's output to its text: the output is
    other drafters' to draft from, and this one's drafts are the prediction's alone.
    """

    def __init__(self, prediction: Sequence[int]) -> None:
        super().__init__((), 1, _RULE, prediction=prediction)

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        pass  # the prediction stays as given
