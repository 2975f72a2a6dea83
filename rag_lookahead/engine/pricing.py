"""The one-off measurement a ``mode="auto"`` engine plans with: forward costs by draft size
(alone and in batches), whether the model verifies trees, and the acceptance statistics that
earlier processes stored (see `LookaheadEngine.measure_costs`)."""

from __future__ import annotations

from pathlib import Path

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.decoding.costs import CostCurve, model_digest
from rag_lookahead.decoding.planner import StepPlanner
from rag_lookahead.decoding.runner import ModelRunner
from rag_lookahead.models import default_cache_dir

__all__ = ["measure_costs"]

# The widest draft per row that batch costs are measured for (wider is extrapolated): in a
# batch the spare compute is shared, and on a CPU a few tokens per row already use it up.
_BATCH_WIDTH = 6


def measure_costs(
    runner: ModelRunner,
    planner: StepPlanner,
    config: LookaheadConfig,
    cache_dir: Path | None,
    *,
    remeasure: bool,
    progress: bool,
) -> CostCurve:
    """Measure (or read from ``cache_dir``) the costs ``config`` may plan with, into ``runner``'s
    costs, and load the stored acceptance statistics into ``planner``; the single-row curve."""
    runner.tree_problem()  # the one-off probe, here rather than in a first answer
    size = config.decoding_length + 1 + config.window_size * (config.ngram_size - 1)
    how = {"remeasure": remeasure, "progress": progress}
    curve = runner.measure_costs(size, cache_dir, **how)  # every variant plans with it
    width = min(_BATCH_WIDTH, config.decoding_length + 1)
    runner.measure_batch_costs(config.max_batch_size, width, cache_dir, **how)
    # What drafts of each source the model accepted in earlier processes: a fresh engine
    # plans its first questions with it rather than with a guess.
    directory = (cache_dir or default_cache_dir()) / "acceptance"
    digest = model_digest(runner.model)
    planner.load_acceptance(directory / f"acceptance-{digest}.json", {"model": digest})
    return curve
