"""What the commands share: the engine, the embedder and the index from the flags."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from rag_lookahead.cli.settings import chunking_config, load_options, lookahead_config, retrieval_config
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.progress import progress_bar
from rag_lookahead.rag import DocumentIndex, RagPipeline, SentenceTransformerEmbedder
from rag_lookahead.serve.readiness import measure_ahead

__all__ = [
    "bundled_index",
    "bundled_questions",
    "chunking_config",
    "load_options",
    "lookahead_config",
    "make_embedder",
    "make_engine",
    "make_pipeline",
    "progress",
    "retrieval_config",
]


def make_engine(
    args: argparse.Namespace, measure: bool = True, reuse_prefixes: bool = True, batches: bool = True
) -> LookaheadEngine:
    """The engine the model and lookahead flags describe (measuring its cost curve first, or
    reading it from the cache, unless not ``measure``; the batches' costs only with
    ``batches``), keeping no prompts for reuse unless ``reuse_prefixes`` (the prefix cache is
    set per engine)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    config = lookahead_config(args)
    config = config if reuse_prefixes else replace(config, prefix_cache_mb=0)
    engine = LookaheadEngine.from_pretrained(config=config, load=load_options(args))
    if measure:  # measured once per model, device and dtype (then cached): no answer pays for it
        measure_ahead(engine, remeasure=args.remeasure, batches=batches)
    return engine


def make_embedder(path: str | None) -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(path)


def make_pipeline(args: argparse.Namespace) -> RagPipeline:
    """The pipeline over the saved index at ``args.index`` (read before the model is loaded),
    answering one question at a time: no batch's costs are measured."""
    index = DocumentIndex.load(Path(args.index))
    return RagPipeline(make_engine(args, batches=False), index, retrieval_config(args))


def progress(description: str) -> Any:
    """A progress-bar wrapper for the library's ``progress`` arguments (drawn on a terminal only)."""

    def wrap(items: Iterable[Any]) -> Iterator[Any]:
        return iter(progress_bar(True, description, iterable=items))

    return wrap


def bundled_index(announce: bool = False) -> DocumentIndex:
    """The bundled corpus indexed, saved and read back (as `index` then `ask` would)."""
    data = resources.files("rag_lookahead") / "data"
    with resources.as_file(data / "corpus") as corpus, tempfile.TemporaryDirectory() as tmp:
        if announce:
            names = ", ".join(sorted(p.name for p in Path(corpus).iterdir()))
            print(f"Indexing the bundled corpus ({names})...", flush=True)
        index, _ = DocumentIndex.build([corpus], make_embedder(None), progress=progress("embedding"))
        index.save(Path(tmp) / "index")
        return DocumentIndex.load(Path(tmp) / "index")


def bundled_questions() -> list[str]:
    """The questions asked about the bundled corpus, in order."""
    text = (resources.files("rag_lookahead") / "data" / "demo_questions.txt").read_text(encoding="utf-8")
    return [q.strip() for q in text.splitlines() if q.strip()]
