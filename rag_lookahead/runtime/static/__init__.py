"""The static-shape step: preallocated slot caches, persistent inputs, a few forward shapes
(`Buckets`), each captured once as a CUDA graph where the model is on one and can be; the
engine's batch in its slots (`StaticBatch`, run by `rag_lookahead.engine.executor`) where its
config names the step (`LookaheadConfig.step`, chosen by `rag_lookahead.tuning.step_choice`)."""

from rag_lookahead.runtime.static.batch import StaticBatch
from rag_lookahead.runtime.static.buckets import Bucket, Buckets
from rag_lookahead.runtime.static.slot_cache import SlotCache, SlotLayer, prompt_entries
from rag_lookahead.runtime.static.step import StaticStep, capture_problem, static_problem

__all__ = [
    "Bucket",
    "Buckets",
    "SlotCache",
    "SlotLayer",
    "StaticBatch",
    "StaticStep",
    "capture_problem",
    "prompt_entries",
    "static_problem",
]
