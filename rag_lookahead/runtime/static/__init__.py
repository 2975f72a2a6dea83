"""The static-shape step: preallocated slot caches, persistent inputs, a few forward shapes
(`Buckets`), each captured once as a CUDA graph where the model is on one and can be. Its
greedy decoder is `rag_lookahead.engine.static_decoder.StaticDecoder`; standalone for now:
the engine's scheduler runs the eager step."""

from rag_lookahead.runtime.static.buckets import Bucket, Buckets
from rag_lookahead.runtime.static.slot_cache import SlotCache, SlotLayer, prompt_entries
from rag_lookahead.runtime.static.step import StaticStep, capture_problem, static_problem

__all__ = [
    "Bucket",
    "Buckets",
    "SlotCache",
    "SlotLayer",
    "StaticStep",
    "capture_problem",
    "prompt_entries",
    "static_problem",
]
