"""A call's predicted output (OpenAI's Predicted Outputs): text its answer is expected to copy.

A prediction (the file being edited, the document being rewritten) is a document with
priority. Where the call drafts from its own text (``draft_policy="suffix"``), it is one more
text of the call's `SuffixDrafter`, preferred where a match in it is as long as the longest
elsewhere; otherwise (the trie's policy, ``mode="jacobi"``, a caller's own drafter) a
`PredictionDrafter` of the prediction alone comes first, its branches taking the step's budget
before any other drafter's (`rag_lookahead.drafting.compose.call_drafter`). Either way its nodes'
sources start with ``PREDICTION_LABEL``: the planner learns apart from documents' drafts how
much of them the model accepts (starting from trust, see `AcceptanceModel`), and the call's
stats count the verified ones (`prediction_outcome`).
"""

from __future__ import annotations

from collections.abc import Sequence

from rag_lookahead.decoding.tree import PREDICTION_LABEL, DraftTree
from rag_lookahead.drafting.suffix import SuffixDrafter, SuffixRule

__all__ = ["PREDICTION_LABEL", "PredictionDrafter", "prediction_outcome"]

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


def prediction_outcome(tree: DraftTree, accepted: Sequence[int]) -> tuple[tuple[bool, ...], int]:
    """What a verified ``tree`` did with the prediction's nodes, given its accepted path (node
    indices, root first): whether each accepted draft token came from the prediction, in order,
    and how many prediction nodes were verified and not accepted."""
    sources = tree.sources
    path = tuple(sources[node].startswith(PREDICTION_LABEL) for node in accepted[1:])
    drafted = sum(source.startswith(PREDICTION_LABEL) for source in sources[1:])
    return path, drafted - sum(path)
