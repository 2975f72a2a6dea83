"""A forward of the built-in model on CPU: eager (torch's BLAS or oneDNN's linear layers, as the
engine runs it) against the same forward compiled by `torch.compile` (inductor, with and without
frozen weights), by the tokens it feeds after a prefilled context.

What it answers: whether compiling the model's forwards is a lever worth building on a CPU, and
what a compiled forward's logits are against eager ones. Each variant times its forwards over a
fresh copy of the same prefilled cache; each width's first calls (the compilation) are timed
apart. The engine itself does not compile (`benchmarks/README.md`, *Compiled forwards*).

    python benchmarks/compiled_forward.py --json compiled-forward.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from rag_lookahead.models import default_model_dir
from rag_lookahead.runtime.kernels import OneDnnLayers

VARIANTS = ("eager-torch", "eager-onednn", "compiled", "compiled-frozen")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=512, help="cached tokens before the timed forward")
    parser.add_argument("--widths", default="1,8,32,64", help="tokens fed per timed forward")
    parser.add_argument("--reps", type=int, default=20, help="timed forwards per width")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"a subset of {','.join(VARIANTS)}")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = args.model or default_model_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    widths = [int(w) for w in args.widths.split(",")]
    generator = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    low = min(100, vocab - 1)  # (a tiny model's vocabulary is smaller)
    context = torch.randint(low, vocab, (1, args.context), generator=generator)
    fed = {w: torch.randint(low, vocab, (1, w), generator=generator) for w in widths}
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=context, cache=cache, use_cache=True)
    results: dict[str, Any] = {}
    reference: dict[int, torch.Tensor] = {}
    for variant in args.variants.split(","):
        results[variant] = _variant(model, variant, cache, fed, args.context, args.reps, reference)
        print(variant, json.dumps(results[variant]), flush=True)
    summary = {"context": args.context, "threads": args.threads, "reps": args.reps, "variants": results}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)


def _variant(
    model: Any,
    variant: str,
    cache: DynamicCache,
    fed: dict[int, torch.Tensor],
    past: int,
    reps: int,
    reference: dict[int, torch.Tensor],
) -> dict[str, Any]:
    """Per width: the least and median seconds of ``reps`` forwards, the first calls' seconds,
    and the logits against eager-torch's (the first variant run is the reference if that is not)."""
    torch._dynamo.reset()
    forward = _forward(model, variant)
    figures: dict[str, Any] = {}
    for width, ids in fed.items():
        positions = torch.arange(past, past + width)[None]  # [1, w]

        def once(ids: torch.Tensor = ids, positions: torch.Tensor = positions) -> tuple[torch.Tensor, float]:
            fresh = copy.deepcopy(cache)  # the timed forward appends to its own copy
            start = time.perf_counter()
            logits = forward(ids, fresh, positions)  # [w, V]
            return logits, time.perf_counter() - start

        start = time.perf_counter()
        logits, _ = once()
        once()
        first = time.perf_counter() - start
        seconds = [once()[1] for _ in range(reps)]
        expected = reference.setdefault(width, logits)
        figures[str(width)] = {
            "least_ms": round(min(seconds) * 1e3, 2),
            "median_ms": round(statistics.median(seconds) * 1e3, 2),
            "first_two_calls_s": round(first, 2),
            "max_abs_logit_difference": float((logits - expected).abs().max()),
            "argmax_agrees": bool(torch.equal(logits.argmax(-1), expected.argmax(-1))),
        }
    return figures


def _forward(model: Any, variant: str) -> Callable[[torch.Tensor, DynamicCache, torch.Tensor], torch.Tensor]:
    call = model
    if variant.startswith("compiled"):
        import torch._inductor.config as inductor

        inductor.freezing = variant == "compiled-frozen"  # weights as constants: oneDNN-packed linears
        call = torch.compile(model, dynamic=True)

    layers = OneDnnLayers(model) if variant == "eager-onednn" else None

    def forward(ids: torch.Tensor, cache: DynamicCache, positions: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), layers.installed() if layers else contextlib.nullcontext():
            out = call(input_ids=ids, cache=cache, position_ids=positions, use_cache=True)
        return out.logits[0]  # [w, V]

    return forward


if __name__ == "__main__":
    main()
