"""Benchmarks: methods timed on the same prompts (`run`) and their chart (`plot`). (Drafting
policies priced on recorded answers without the model: `benchmarks/replay.py`, a lab tool.)

Its names are imported when first used (`rag_lookahead.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_lookahead.lazy import lazy_attributes

if TYPE_CHECKING:
    from rag_lookahead.bench.methods import METHODS
    from rag_lookahead.bench.run import BenchInput, MethodResult, gold_inputs, load_records, run_benchmark

__all__ = ["METHODS", "BenchInput", "MethodResult", "gold_inputs", "load_records", "run_benchmark"]

__getattr__ = lazy_attributes(
    __name__,
    {
        "METHODS": "rag_lookahead.bench.methods",
        **dict.fromkeys(
            ("BenchInput", "MethodResult", "gold_inputs", "load_records", "run_benchmark"),
            "rag_lookahead.bench.run",
        ),
    },
)
