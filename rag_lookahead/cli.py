"""The `rag-lookahead` command: `demo` and `bench`."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Sequence

import torch

from rag_lookahead.bench import METHODS, format_table, load_records, run_benchmark
from rag_lookahead.config import LookaheadConfig
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.prompts import rag_messages

__all__ = ["main"]


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        default=None,
        help="local model directory or a hub id already in the local cache "
        "(default: the embedded SmolLM2-135M-Instruct; nothing is downloaded)",
    )
    group.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (default: cpu)")
    group.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "float16", "bfloat16"],
        help="model dtype (default: float32 on CPU, the checkpoint's dtype elsewhere)",
    )
    group.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    group.add_argument(
        "--trust-remote-code", action="store_true", help="run model code shipped with the checkpoint"
    )
    look = parser.add_argument_group("lookahead")
    defaults = LookaheadConfig()
    look.add_argument(
        "--mode", default=defaults.mode, choices=["trie", "auto", "off"],
        help=f"trie: fixed draft budget; auto: cost-aware budget; off: plain (default: {defaults.mode})",
    )
    look.add_argument(
        "--decoding-length", type=int, default=defaults.decoding_length,
        help=f"most draft tokens verified per forward (default: {defaults.decoding_length})",
    )
    look.add_argument(
        "--branch-length", type=int, default=defaults.branch_length,
        help=f"deepest draft branch (default: {defaults.branch_length})",
    )


def _engine(args: argparse.Namespace) -> LookaheadEngine:
    if args.threads:
        torch.set_num_threads(args.threads)
    config = LookaheadConfig(
        mode=args.mode, decoding_length=args.decoding_length, branch_length=args.branch_length
    )
    return LookaheadEngine.from_pretrained(
        args.model, config=config, device=args.device, dtype=args.dtype,
        trust_remote_code=args.trust_remote_code,
    )


def _bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    records = load_records(args.data, args.limit)
    engine = _engine(args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    summary = run_benchmark(
        engine, records, args.max_new_tokens, methods,
        progress=lambda items: iter(tqdm(items, desc="records", file=sys.stderr)),
    )
    summary["data"] = Path(args.data).name
    print(format_table(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    if args.plot:
        from rag_lookahead.plot import plot_summary

        plot_summary(summary, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    sample = resources.files("rag_lookahead") / "data" / "sample.jsonl"
    with resources.as_file(sample) as path:
        records = load_records(path)
    print("Loading the model (the default is converted once to safetensors on first use)...")
    engine = _engine(args)
    if engine.config.mode == "auto" and engine.tree_verification:
        print("Measuring forward costs by draft size (once per model, device and dtype)...")
        engine.cost_curve  # noqa: B018 - measured now so that no answer below pays for it
    plain = LookaheadEngine(engine.model, engine.tokenizer, LookaheadConfig(mode="off"))
    for record in records:
        messages = rag_messages(record["question"], record["context"])
        print(f"\n=== {record['question']}")
        runs = {}
        for label, runner in (("greedy", plain), ("lookahead", engine)):
            completion = runner.complete(messages, max_new_tokens=args.max_new_tokens)
            runs[label] = completion
            stats = completion.stats
            print(
                f"--- {label}: {stats.new_tokens} tokens, {stats.tokens_per_s:.1f} tok/s, "
                f"{stats.tokens_per_step:.2f} tokens per forward"
            )
            print(completion.text.strip())
        same = runs["greedy"].token_ids == runs["lookahead"].token_ids
        speedup = runs["lookahead"].stats.tokens_per_s / max(runs["greedy"].stats.tokens_per_s, 1e-9)
        print(f"--- identical: {same}; lookahead speedup: {speedup:.2f}x")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rag-lookahead",
        description="Lossless lookahead decoding for RAG answers: faster, token for token the same.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="greedy vs lookahead on a bundled sample")
    demo.add_argument("--max-new-tokens", type=int, default=128, help="tokens per answer (default: 128)")
    _add_model_flags(demo)
    demo.set_defaults(run=_demo)
    bench = sub.add_parser("bench", help="time greedy, prompt lookup and lookahead on a JSONL set")
    bench.add_argument("--data", required=True, type=Path, help="JSONL with 'question' and 'context'")
    bench.add_argument("--limit", type=int, default=None, help="use the first N records")
    bench.add_argument("--max-new-tokens", type=int, default=128, help="tokens per answer (default: 128)")
    bench.add_argument("--json", default=None, help="write the summary here")
    bench.add_argument("--plot", default=None, help="write a PNG chart of the summary here")
    bench.add_argument(
        "--methods", default="greedy,prompt_lookup,lookahead",
        help=f"comma-separated subset of {','.join(METHODS)} (greedy always runs as the reference)",
    )
    _add_model_flags(bench)
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ValueError, FileNotFoundError) as err:
        print(f"rag-lookahead: error: {err}", file=sys.stderr)
        return 2
