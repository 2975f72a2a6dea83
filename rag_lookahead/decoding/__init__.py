"""Decoding: the draft tree, its verification, the KV cache, the model runner and the planner.

Everything that touches the model or decides what one forward verifies lives here; drafters
(`rag_lookahead.drafting`) only build `DraftTree`s from token ids.
"""

from rag_lookahead.decoding.acceptance import AcceptanceModel
from rag_lookahead.decoding.costs import CostCurve
from rag_lookahead.decoding.planner import StepPlanner, plan_draft
from rag_lookahead.decoding.runner import ModelRunner
from rag_lookahead.decoding.tree import DraftTree, SideRows, TreeInputs
from rag_lookahead.decoding.verify import Accepted, TokenChooser, accept

__all__ = [
    "AcceptanceModel",
    "Accepted",
    "CostCurve",
    "DraftTree",
    "ModelRunner",
    "SideRows",
    "StepPlanner",
    "TokenChooser",
    "TreeInputs",
    "accept",
    "plan_draft",
]
