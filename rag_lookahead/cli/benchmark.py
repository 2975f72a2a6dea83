"""`bench`: every method on the same prompts, with gold or retrieved contexts; `eval-retrieval`:
how often retrieval finds the gold context."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rag_lookahead.bench.concurrency import CONCURRENCY_METHODS, format_concurrency, run_concurrency
from rag_lookahead.bench.fresh import format_fresh, parse_cost_curve, run_fresh
from rag_lookahead.bench.retrieval import evaluate_retrieval, format_retrieval, load_qa_records
from rag_lookahead.bench.run import BenchInput, format_table, gold_inputs, load_records, run_benchmark
from rag_lookahead.cli.setup import (
    bundled_index,
    bundled_questions,
    chunking_config,
    make_embedder,
    make_engine,
    progress,
    retrieval_config,
)
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.planning.load import watch_load
from rag_lookahead.rag import Document, DocumentIndex, RagPipeline
from rag_lookahead.rag.index import check_mode

__all__ = ["BUNDLED", "run_bench", "run_eval_retrieval", "run_measure"]

BUNDLED = "bundled"  # --data: the bundled corpus and its questions, with retrieval


def run_bench(args: argparse.Namespace) -> int:
    if args.cost_curve and not args.fresh:
        raise ValueError("--cost-curve is for --fresh")
    if args.rounds > 1 and not args.concurrency:
        raise ValueError("--rounds is for --concurrency")
    curve = parse_cost_curve(args.cost_curve) if args.cost_curve else None  # before the model loads
    bundled = str(args.data) == BUNDLED
    records = [] if bundled else load_records(args.data, args.limit)
    engine = make_engine(args)
    if bundled:
        inputs = _bundled_inputs(args, engine)
    elif args.retrieval != "gold":
        inputs = _retrieved_inputs(args, engine, records)
    else:
        inputs = gold_inputs(engine, records)
    if args.fresh:
        summary = run_fresh(engine, inputs, args.max_new_tokens, curve, progress=progress("questions"))
        return _report(args, summary, format_fresh, "plot_fresh")
    if args.concurrency:
        return _run_concurrency(args, engine, inputs)
    methods = _names(args.methods or "greedy,prompt_lookup,lookahead")
    summary = run_benchmark(engine, inputs, args.max_new_tokens, methods, progress=progress("records"))
    summary["retrieval"] = "gold" if args.retrieval == "gold" else retrieval_config(args).mode
    if args.retrieval != "gold":
        summary["top_k"] = args.top_k
    return _report(args, summary, format_table, "plot_summary")


def run_measure(args: argparse.Namespace) -> int:
    """Time the forward costs again, replacing the cached ones, and show them with the load
    the machine was under meanwhile."""
    engine = make_engine(args, measure=False)
    if not engine.tree_verification:
        raise ValueError("this model cannot verify draft trees: it decodes plainly, with no costs to plan")
    with watch_load() as seen:
        curve = engine.measure_costs(remeasure=True)
    one = curve.seconds[0]
    where = f"{engine.model_name} on {engine.runner.device}"
    print(f"Forward costs of {where}, relative to one token ({one * 1e3:.1f} ms):")
    print("  tokens: " + " ".join(f"{size:>5}" for size in curve.sizes))
    print("  cost:   " + " ".join(f"{seconds / one:>5.2f}" for seconds in curve.seconds))
    batch = engine.costs.batch
    for rows, by_width in batch.curves if batch is not None else ():
        widths = " ".join(
            f"{w}: {s / one:.2f}" for w, s in zip(by_width.sizes, by_width.seconds, strict=True)
        )
        print(f"  {rows} rows, by tokens per row: {widths}")
    print(f"While timing, {seen[0].describe()}.")
    print("Cached for later runs; run `rag-lookahead measure` again on a quiet machine to replace them.")
    return 0


def run_eval_retrieval(args: argparse.Namespace) -> int:
    """Recall of the gold context per retrieval mode, with build and query times."""
    modes = [check_mode(mode) for mode in _names(args.modes)]
    if not modes:
        raise ValueError("no retrieval mode to evaluate")
    config = chunking_config(args)
    records = load_qa_records(args.data, args.limit)  # before the embedder loads
    if args.threads:
        torch.set_num_threads(args.threads)
    summary = evaluate_retrieval(
        records,
        make_embedder(args.embedder),
        name=Path(args.data).name,
        config=config,
        modes=modes,
        progress=progress("embedding"),
    )
    print(format_retrieval(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


def _run_concurrency(args: argparse.Namespace, engine: LookaheadEngine, inputs: list[BenchInput]) -> int:
    levels = args.concurrency  # parsed and checked with the other flags (rag_lookahead.cli.values)
    methods = _names(args.methods) if args.methods else list(CONCURRENCY_METHODS)
    summary = run_concurrency(
        engine, inputs, args.max_new_tokens, levels, methods, args.arrival_rate, rounds=args.rounds
    )
    return _report(args, summary, format_concurrency, "plot_concurrency")


def _report(
    args: argparse.Namespace,
    summary: dict[str, Any],
    table: Callable[[dict[str, Any]], str],
    plot: str,
) -> int:
    """Print the table; write the JSON and the chart when asked."""
    summary["data"] = Path(args.data).name
    print(table(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    if args.plot:
        from rag_lookahead.bench import plot as charts

        getattr(charts, plot)(summary, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def _bundled_inputs(args: argparse.Namespace, engine: LookaheadEngine) -> list[BenchInput]:
    """The bundled corpus's questions, each answered from its retrieved chunks."""
    pipeline = RagPipeline(engine, bundled_index(), retrieval_config(args))
    questions = bundled_questions()[: args.limit]
    return [_prepared(pipeline, question, args.max_new_tokens) for question in questions]


def _prepared(pipeline: RagPipeline, question: str, max_new_tokens: int) -> BenchInput:
    query = pipeline.prepare(question, max_new_tokens)
    return BenchInput(query.prompt_ids, query.documents)


def _retrieved_inputs(
    args: argparse.Namespace, engine: LookaheadEngine, records: list[dict[str, str]]
) -> list[BenchInput]:
    """True RAG: every context of the file indexed, each question answered from its top-k chunks."""
    contexts = dict.fromkeys(r["context"] for r in load_records(args.data))  # all records, once each
    name = Path(args.data).name
    documents = [Document(f"{name}#{i}", text) for i, text in enumerate(contexts, 1) if text.strip()]
    index = DocumentIndex(make_embedder(None))
    index.add(documents, progress("indexing contexts"))
    pipeline = RagPipeline(engine, index, retrieval_config(args))
    return [_prepared(pipeline, r["question"], args.max_new_tokens) for r in records]
