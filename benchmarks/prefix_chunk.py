"""A prompt's attention (`attention.causal_chunk`) three ways, alternated in one process.

A prompt whose first tokens the prefix cache holds (every chat prompt shares its template's
first tokens) is forwarded as a chunk after them, under a causal mask aligned to the last
column. ``masked``: as the model hands it over, a masked kernel computing every score (and a
whole prompt by torch's causal kernel); ``causal``: the chunk by the causal kernel after zero
queries; ``blocks``: a long chunk or prompt block by block of queries on oneDNN, where the
engine's linear layers run on oneDNN for a prompt's chunk (else it is ``causal``). Two
measurements, each alternating the ways round by round:

- ``forward``: the longest prompt of the first ``--limit`` records (as `rag-lookahead bench`
  asks them: `rag_messages`), forwarded after its template's cached tokens (``after``) and
  whole (``whole``), in the model's thread; the seconds per round, and the largest difference
  of the last logits from the whole prompt's under ``masked``.
- ``answers``: the engine with lookahead (its prefix cache on, as by default) answering the
  records one after another, ``--max-new-tokens`` each; the sum of the times to first token,
  the wall seconds, and a digest of the answers (the same in every way: greedy).

    python benchmarks/prefix_chunk.py --data dolly_context_qa.jsonl --json prefix-chunk.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rag_lookahead import LookaheadEngine, rag_messages
from rag_lookahead.bench.run import fresh_engine, load_records
from rag_lookahead.prompts import encode_prompt
from rag_lookahead.runtime import attention
from rag_lookahead.runtime.kv_cache import new_tree_cache

WAYS = ("blocks", "causal", "masked")


@contextmanager
def _way(name: str) -> Iterator[None]:
    """Within this block, a prompt and its chunks attend as ``name`` says."""
    rule, blocks = attention._causal_columns, attention._BLOCKS_FROM
    if name != "blocks":
        attention._BLOCKS_FROM = (sys.maxsize, sys.maxsize)
    if name == "masked":
        attention._causal_columns = lambda *args, **kwargs: None
    try:
        yield
    finally:
        attention._causal_columns, attention._BLOCKS_FROM = rule, blocks


def _forwards(engine: LookaheadEngine, prompt: list[int], cached: int, rounds: int) -> dict[str, Any]:
    runner = engine.runner
    ids = torch.tensor([prompt])

    def job() -> dict[str, Any]:
        seconds: dict[str, list[float]] = {f"{n}/{part}": [] for n in WAYS for part in ("after", "whole")}
        last: dict[str, torch.Tensor] = {}
        runner.forward(ids, new_tree_cache(), last_only=True)  # the process's first long forward, untimed
        for _ in range(rounds):
            for name in seconds:
                way, part = name.split("/")
                with _way(way):
                    cache = new_tree_cache()
                    if part == "after":
                        _, cache = runner.forward(ids[:, :cached], cache, last_only=True)
                    started = time.perf_counter()
                    logits, _ = runner.forward(
                        ids[:, cached:] if part == "after" else ids, cache, last_only=True
                    )
                    seconds[name].append(round(time.perf_counter() - started, 3))
                    last[name] = logits[-1]
        reference = last["masked/whole"]
        differs = {name: float((logits - reference).abs().max()) for name, logits in last.items()}
        return {"seconds": seconds, "max_logit_difference_from_masked_whole": differs}

    return runner.thread.call(job)


def _answers(engine: LookaheadEngine, prompts: list[list[int]], tokens: int, rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in WAYS}
    for _ in range(rounds):
        for name in WAYS:
            fresh = fresh_engine(engine, engine.config)  # a trie and prefix cache of its own
            with _way(name):
                runs[name].append(_answered(fresh, prompts, tokens))
    return runs


def _answered(engine: LookaheadEngine, prompts: list[list[int]], tokens: int) -> dict[str, Any]:
    "".join(engine.stream("The weather today is", max_new_tokens=8))  # the warm-up
    firsts, texts = [], []
    started = time.perf_counter()
    for prompt in prompts:
        sent, seen = time.perf_counter(), None
        with engine.stream(prompt, max_new_tokens=tokens) as stream:
            for chunk in stream.chunks():
                if seen is None and (chunk.text or chunk.token_ids):
                    seen = time.perf_counter() - sent
            texts.append(stream.text)
        firsts.append(round(seen or 0.0, 3))
    wall = time.perf_counter() - started
    digest = hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:16]
    return {
        "ttft_sum_s": round(sum(firsts), 3),
        "ttft_s": firsts,
        "wall_s": round(wall, 3),
        "answers": digest,
    }


def _attention(engine: LookaheadEngine, lengths: list[int]) -> list[dict[str, Any]]:
    config = engine.model.config
    heads, groups = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return engine.runner.thread.call(lambda: [_layer(heads, groups, dim, n) for n in lengths])


def _layer(heads: int, groups: int, dim: int, length: int) -> dict[str, Any]:
    """One layer's attention of a whole prompt of ``length`` tokens, both ways."""
    query = torch.randn(1, heads, length, dim)  # [1, H, T, D]
    key, value = torch.randn(1, groups, length, dim), torch.randn(1, groups, length, dim)
    ways = {
        "sdpa_ms": lambda: torch.nn.functional.scaled_dot_product_attention(
            query, key, value, is_causal=True, enable_gqa=heads != groups
        ),
        "blocks_ms": lambda: attention._causal_blocks(query, key, value, None, 0),
    }
    row: dict[str, Any] = {"tokens": length}
    for name, way in ways.items():
        way()
        seconds = []
        for _ in range(3):
            started = time.perf_counter()
            way()
            seconds.append(time.perf_counter() - started)
        row[name] = round(1000 * sorted(seconds)[1], 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a JSONL set (question, context)")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", default="1024,2048,4096,8192", help="prompt tokens of `attention`")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    engine = LookaheadEngine.from_pretrained()
    engine.runner.thread.call(lambda: torch.set_num_threads(args.threads))
    engine.measure_costs()
    records = load_records(args.data, args.limit)
    prompts = [encode_prompt(engine.tokenizer, rag_messages(r["question"], r["context"])) for r in records]
    longest = max(prompts, key=len)
    shared = next(i for i, (a, b) in enumerate(zip(*prompts[:2], strict=False)) if a != b)
    forward = _forwards(engine, longest, shared, args.rounds)
    answers = _answers(engine, prompts, args.max_new_tokens, args.rounds)
    layer = _attention(engine, [int(n) for n in args.lengths.split(",")])
    summary = {
        "benchmark": "prefix_chunk",
        "data": args.data.stem,
        "records": len(prompts),
        "threads": args.threads,
        "prompt_tokens": len(longest),
        "cached_tokens": shared,
        "linear": str(engine.runner.linear),
        "forward": forward,
        "answers": answers,
        "attention": layer,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
