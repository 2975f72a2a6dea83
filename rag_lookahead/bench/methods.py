"""The names of the methods the benchmarks time, apart from their code (which needs torch), so
that the command line lists them in its help before anything heavy is imported."""

from __future__ import annotations

__all__ = ["CONCURRENCY_METHODS", "METHODS"]

# One question at a time (`rag_lookahead.bench.run`); ``off``: the engine without drafts;
# ``greedy_compiled``: transformers' fastest plain decoding, a static cache and its decoding
# forward compiled (``reduce-overhead``: replayed CUDA graphs on a GPU), compiled at its warm-up.
METHODS = ("greedy", "greedy_compiled", "prompt_lookup", "lookahead", "trie", "jacobi", "auto", "off")
# Concurrent clients (`rag_lookahead.bench.concurrency`).
CONCURRENCY_METHODS = ("serialised", "batched", "hf_static_batch", "hf_continuous_batching", "prompt_lookup")
