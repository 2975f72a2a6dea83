"""Decoding maths: the draft tree, its masks, verification and the grammar at every node.

Pure functions and value types over token ids and logits; nothing here runs the model
(`rag_lookahead.runtime`) or prices a forward (`rag_lookahead.planning`), and drafters
(`rag_lookahead.drafting`) only build `DraftTree`s from token ids.
"""

from rag_lookahead.decoding.tree import DraftTree, SideRows, StepDraft, TreeInputs
from rag_lookahead.decoding.verify import Accepted, TokenChooser, accept

__all__ = ["Accepted", "DraftTree", "SideRows", "StepDraft", "TokenChooser", "TreeInputs", "accept"]
