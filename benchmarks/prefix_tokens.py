"""Prompt tokens a prefix cache keeps for a set's prompts: each prompt whole, or a radix tree.

Counts only (no forward runs, so the figures do not depend on the machine's load): for the
first ``--limit`` prompts of a set as the engine formats them (chat template, system prompt,
context, question), the KV entries kept when every prompt is kept whole (the cache before the
radix tree, where a prompt covering another replaced it) against a radix tree over token ids
(shared beginnings once), and the tokens each prompt finds cached from the ones before it
(the same for both).

    python benchmarks/prefix_tokens.py --data dolly_context_qa.jsonl --limit 100
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.bench.run import gold_inputs, load_records


def whole_tokens(prompts: Sequence[tuple[int, ...]]) -> int:
    """Tokens kept when each prompt is an entry of its own, unless a longer one begins with it."""
    kept = set(prompts)
    return sum(len(p) for p in kept if not any(q != p and q[: len(p)] == p for q in kept))


def radix_tokens(prompts: Sequence[tuple[int, ...]]) -> int:
    """Tokens kept in a tree over token ids: one per distinct prefix."""
    return len({p[:n] for p in prompts for n in range(1, len(p) + 1)})


def reused_tokens(prompts: Sequence[tuple[int, ...]]) -> list[int]:
    """Per prompt, the tokens found cached from the earlier ones (never its last)."""
    reused = []
    for i, prompt in enumerate(prompts):
        best = 0
        for earlier in prompts[:i]:
            shared = next((k for k, (a, b) in enumerate(zip(prompt, earlier, strict=False)) if a != b), None)
            best = max(best, min(len(prompt), len(earlier)) if shared is None else shared)
        reused.append(min(best, len(prompt) - 1))
    return reused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    engine = LookaheadEngine.from_pretrained(args.model, config=LookaheadConfig(prefix_cache_mb=0))
    prompts = [tuple(item.prompt_ids) for item in gold_inputs(engine, load_records(args.data, args.limit))]
    config = engine.model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * heads * head_dim * engine.model.dtype.itemsize
    whole, radix, reused = whole_tokens(prompts), radix_tokens(prompts), reused_tokens(prompts)
    print(
        json.dumps(
            {
                "prompts": len(prompts),
                "prompt_tokens": sum(map(len, prompts)),
                "kept_tokens_whole_prompts": whole,
                "kept_tokens_radix_tree": radix,
                "kept_mib_whole_prompts": round(whole * per_token / 2**20, 1),
                "kept_mib_radix_tree": round(radix * per_token / 2**20, 1),
                "reused_tokens": sum(reused),
                "reused_tokens_median": sorted(reused)[len(reused) // 2],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
