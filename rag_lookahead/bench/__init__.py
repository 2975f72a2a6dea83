"""Benchmarks: methods timed on the same prompts (`run`), their chart (`plot`), and drafting
policies priced on recorded answers without the model (`replay`)."""

from rag_lookahead.bench.run import (
    METHODS,
    BenchInput,
    MethodResult,
    gold_inputs,
    load_records,
    run_benchmark,
)

__all__ = ["METHODS", "BenchInput", "MethodResult", "gold_inputs", "load_records", "run_benchmark"]
