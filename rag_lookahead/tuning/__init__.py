"""The tuning wing: what the engine's forwards run on, chosen when the engine is built (and again
after the model's structure changed), as one `Backend` record. tuner.py (ModelTuning: the
backend of one model and the runner on it; re-derived after a change), kernel_choice.py (the
linear kernels by a forward's tokens, timed by forwards), kernel_cache.py (that choice kept on
disk), probes.py (tree support, the direct forward's exactness, packed rows), timers.py (timed
forwards), cost_timing.py (the cost curves ``mode="auto"`` plans with), bucket_costs.py (the
same, from a static step's buckets), trials.py (runners of a timer's or probe's own)."""

from rag_lookahead.runtime.backend import Backend, Source
from rag_lookahead.tuning.tuner import ModelTuning

__all__ = ["Backend", "ModelTuning", "Source"]
