"""Which BM25 library backs the keyword index: bm25s, rank-bm25 or tantivy, on the same corpus.

Every context of the given sets is a document (identical contexts once), every question a query
(top 10). Each library runs in a process of its own so that its peak memory is its own:
``rss_mb`` is the growth of the peak resident set from just after the imports to the end.
bm25s and rank-bm25 get the same tokens (lowercased words, English stop words out, Snowball
stems); tantivy uses its own ``en_stem`` tokenizer. Persistence is part of the choice: the index
is saved and loaded again where the library can do that without pickle.

    python benchmarks/bm25_choice.py --data a.jsonl b.jsonl --repeat 10 --json benchmarks/bm25-choice.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from retrieval_build import cpu_name

LIBRARIES = ("bm25s", "rank_bm25", "tantivy")


def load(paths: list[str], repeat: int) -> tuple[list[str], list[str]]:
    contexts: dict[str, None] = {}
    questions: list[str] = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").split("\n"):
            if line.strip():
                record = json.loads(line)
                contexts.setdefault(record["context"], None)
                questions.append(record["question"])
    # Copies numbered apart, so that a larger corpus keeps the sets' word statistics.
    docs = [f"{text} copy{i}" if i else text for i in range(repeat) for text in contexts]
    return docs, questions


def tokens(texts: list[str]) -> list[list[str]]:
    from rag_lookahead.rag.keyword import tokenize

    return [tokenize(text) for text in texts]


def run_bm25s(docs: list[str], queries: list[str], tmp: Path) -> dict[str, Any]:
    import bm25s

    start = time.perf_counter()
    index = bm25s.BM25()
    index.index(tokens(docs), show_progress=False)
    built = time.perf_counter()
    index.save(tmp / "bm25s", show_progress=False)
    saved = time.perf_counter()
    index = bm25s.BM25.load(tmp / "bm25s")
    loaded = time.perf_counter()
    for query in tokens(queries):
        index.retrieve([query or [""]], k=10, show_progress=False)
    done = time.perf_counter()
    size = sum(p.stat().st_size for p in (tmp / "bm25s").iterdir())
    return _times(start, built, saved, loaded, done) | {"saved_kb": size // 1024, "format": "npy + JSON"}


def run_rank_bm25(docs: list[str], queries: list[str], tmp: Path) -> dict[str, Any]:
    import numpy as np
    from rank_bm25 import BM25Okapi

    start = time.perf_counter()
    index = BM25Okapi(tokens(docs))
    built = time.perf_counter()
    for query in tokens(queries):
        np.argsort(index.get_scores(query))[::-1][:10]
    done = time.perf_counter()
    times = _times(start, built, built, built, done)
    return times | {"save_s": None, "load_s": None, "format": "none (pickle the object, or rebuild)"}


def run_tantivy(docs: list[str], queries: list[str], tmp: Path) -> dict[str, Any]:
    import tantivy

    start = time.perf_counter()
    schema_builder = tantivy.SchemaBuilder()
    schema_builder.add_text_field("body", stored=False, tokenizer_name="en_stem")
    schema_builder.add_integer_field("row", stored=True, indexed=False)
    schema = schema_builder.build()
    (tmp / "tantivy").mkdir()
    index = tantivy.Index(schema, path=str(tmp / "tantivy"))
    writer = index.writer(heap_size=50_000_000, num_threads=1)
    for row, doc in enumerate(docs):
        writer.add_document(tantivy.Document(body=doc, row=row))
    writer.commit()
    writer.wait_merging_threads()
    built = time.perf_counter()
    index = tantivy.Index.open(str(tmp / "tantivy"))
    index.reload()
    searcher = index.searcher()
    loaded = time.perf_counter()
    for query in queries:
        words = " ".join(w for w in tokens([query])[0])  # query syntax characters out
        if words:
            searcher.search(index.parse_query(words, ["body"]), 10)
    done = time.perf_counter()
    size = sum(p.stat().st_size for p in (tmp / "tantivy").rglob("*") if p.is_file())
    return _times(start, built, built, loaded, done) | {
        "save_s": 0.0,  # the index is written as it is built
        "saved_kb": size // 1024,
        "format": "tantivy segments",
    }


def _times(start: float, built: float, saved: float, loaded: float, done: float) -> dict[str, Any]:
    return {
        "build_s": round(built - start, 3),
        "save_s": round(saved - built, 3),
        "load_s": round(loaded - saved, 3),
        "query_s": round(done - loaded, 3),
    }


def child(library: str, paths: list[str], repeat: int) -> None:
    docs, queries = load(paths, repeat)
    runner = {"bm25s": run_bm25s, "rank_bm25": run_rank_bm25, "tantivy": run_tantivy}[library]
    __import__(library)
    tokens(["warm the stemmer up"])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory() as tmp:
        result = runner(docs, queries, Path(tmp))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result |= {"rss_mb": round((peak - base) / 1024, 1), "documents": len(docs), "queries": len(queries)}
    print(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", required=True)
    parser.add_argument("--json", default=None)
    parser.add_argument("--repeat", type=int, default=1, help="index every context this many times")
    parser.add_argument("--child", default=None, choices=LIBRARIES)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.data, args.repeat)
        return 0
    results = {}
    for library in LIBRARIES:
        command = [sys.executable, __file__, "--child", library, "--repeat", str(args.repeat)]
        out = subprocess.run(
            [*command, "--data", *args.data],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        results[library] = json.loads(out.strip().splitlines()[-1])
        print(library, results[library])
    summary = {
        "data": [Path(p).name for p in args.data],
        "repeat": args.repeat,
        "cpu": cpu_name(),
        "libraries": results,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
