"""Soak test: many questions through one RAG pipeline, checking the trie after every one.

After each query no node may still be owned by it (its document and prompt branches are
eliminated), and the trie never holds more nodes than its cap; the model's own output branches
stay, pruned under the cap. Reports the trie's peak size and the process's peak memory.

    python benchmarks/soak.py --data llma_msmarco_rag.jsonl --queries 2000 --json soak.json
    python benchmarks/soak.py --data ... --tiny   # a tiny random model: the same trie traffic, fast

Not a CI test: 2,000 queries with the real model take about an hour on two CPU cores.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.bench.run import load_records
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.models import default_model_dir
from rag_lookahead.rag import (
    Document,
    DocumentIndex,
    RagPipeline,
    RetrievalConfig,
    SentenceTransformerEmbedder,
)


def tiny_engine(config: LookaheadConfig) -> LookaheadEngine:
    """A 2-layer random LLaMA with the default model's tokenizer: fast, with real token traffic."""
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    torch.manual_seed(0)
    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    )
    return LookaheadEngine(LlamaForCausalLM(model_config).eval(), tokenizer, config)


def rag_pipeline(
    records: list[dict[str, str]], config: LookaheadConfig, tiny: bool, model: str | None = None
) -> RagPipeline:
    """Every context of ``records`` indexed once, answered by SmolLM2 (or the tiny model, or
    ``model``)."""
    contexts = dict.fromkeys(r["context"] for r in records)
    index = DocumentIndex(SentenceTransformerEmbedder())
    index.add([Document(f"ctx#{i}", text) for i, text in enumerate(contexts) if text.strip()])
    engine = tiny_engine(config) if tiny else LookaheadEngine.from_pretrained(model, config=config)
    if config.mode == "auto":
        engine.measure_costs()
    return RagPipeline(engine, index, RetrievalConfig(top_k=4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-trie-nodes", type=int, default=LookaheadConfig().max_trie_nodes)
    parser.add_argument("--tiny", action="store_true", help="a tiny random model instead of SmolLM2")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    records = load_records(args.data)
    config = LookaheadConfig(mode="trie", max_trie_nodes=args.max_trie_nodes)
    pipeline = rag_pipeline(records, config, args.tiny, args.model)
    engine = pipeline.engine

    peak_nodes, leaked, started = 0, 0, time.perf_counter()
    for n in range(args.queries):
        question = records[n % len(records)]["question"]
        pipeline.ask(question, max_new_tokens=args.max_new_tokens)
        peak_nodes = max(peak_nodes, len(engine.trie))
        leaked += sum(engine.trie.count_owned(o) for o in engine.trie.owners() - {OUTPUT_OWNER})
        if (n + 1) % 100 == 0:
            print(f"{n + 1} queries: trie {len(engine.trie)} nodes, leaked {leaked}", flush=True)
    report = {
        "data": args.data.name,
        "queries": args.queries,
        "model": "tiny-random-llama" if args.tiny else args.model or "SmolLM2-135M-Instruct",
        "max_new_tokens": args.max_new_tokens,
        "max_trie_nodes": args.max_trie_nodes,
        "peak_trie_nodes": peak_nodes,
        "final_trie_nodes": len(engine.trie),
        "nodes_left_owned_by_finished_queries": leaked,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
