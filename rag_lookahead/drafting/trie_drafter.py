"""One generation call's view of the shared token trie."""

from __future__ import annotations

from collections.abc import Sequence

from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting.trie import OUTPUT_OWNER, TokenTrie

__all__ = ["TrieDrafter"]


class TrieDrafter:
    """Drafts from the branches this call owns (prompt, documents) and from past outputs.

    The call's branches are inserted on construction and eliminated by `close`, unless the
    owner is a `DocumentScope`'s, which eliminates them itself; the tokens it generates are
    added to the shared output branches as they are accepted, so they help the rest of this
    answer as well as later calls.
    """

    def __init__(
        self,
        trie: TokenTrie,
        owner: str,
        sequences: Sequence[Sequence[int]],
        min_match: int,
        *,
        eliminate_on_close: bool = True,
    ) -> None:
        self.trie = trie
        self.owner = owner
        self.eliminate_on_close = eliminate_on_close
        self.min_match = min_match
        with trie.lock:  # all of the call's texts at once, as one update
            for seq in sequences:
                trie.insert(seq, owner)
            self._outputs = trie.insert_cursor(OUTPUT_OWNER)

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        draft = self.trie.draft(context, self.owner, budget, self.min_match)
        # Sources name the kind of branch and the match length, e.g. "doc2" or "out1": the
        # acceptance statistics are kept apart for each.
        sources = [f"{'doc' if own else 'out'}{draft.match_length}" for own in draft.owned]
        tree = DraftTree.from_draft(context[-1], draft.tokens, draft.parents, sources, draft.estimates)
        return StepDraft(tree)

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        self._outputs.extend(tokens)

    def close(self) -> None:
        if self.eliminate_on_close:
            self.trie.eliminate(self.owner)
