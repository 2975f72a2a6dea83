"""What a forward costs and what a draft is worth: the measured cost curves and their online
calibration, the acceptance statistics per draft source, and the planner that verifies only
the part of a draft expected to pay (``mode="auto"``)."""

from rag_lookahead.planning.acceptance import AcceptanceModel
from rag_lookahead.planning.costs import CostCurve, CostModel
from rag_lookahead.planning.planner import StepPlanner, plan_draft

__all__ = ["AcceptanceModel", "CostCurve", "CostModel", "StepPlanner", "plan_draft"]
