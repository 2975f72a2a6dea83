"""The `rag-lookahead` command: `index`, `ask`, `chat`, `demo`, `measure`, `bench`,
`eval-retrieval` and `serve`.

The arguments are parsed before anything heavy is imported: everything imported here is light
(configs, names, defaults), so ``--help``, ``--version`` and a mistyped flag are answered
without loading torch. Each command names the function that runs it as ``"module:function"``
of this package, imported only once the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rag_lookahead import __version__
from rag_lookahead.bench.methods import CONCURRENCY_METHODS, METHODS
from rag_lookahead.cli.flags import add_max_new_tokens, add_top_k
from rag_lookahead.cli.lines import logged_lines
from rag_lookahead.cli.serve import API_KEY_VARIABLE, SERVE_BACKENDS
from rag_lookahead.cli.settings import chunking_config, load_options, lookahead_config, retrieval_config
from rag_lookahead.cli.values import (
    client_counts,
    cosine,
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)
from rag_lookahead.config import LookaheadConfig
from rag_lookahead.models import BUILTIN_MODELS, DEFAULT_MODEL
from rag_lookahead.rag.chunking import ChunkingConfig
from rag_lookahead.rag.retrieval import RETRIEVAL_MODES, RetrievalConfig
from rag_lookahead.serve.settings import ServeSettings

__all__ = ["build_parser", "main"]


def _model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        default=None,
        help=f"a built-in model ({', '.join(BUILTIN_MODELS)}), a local model directory or a hub id "
        f"already in the local cache (default: {DEFAULT_MODEL}; nothing is downloaded)",
    )
    group.add_argument(
        "--device",
        default=None,
        help="cpu, cuda, cuda:1, mps ... (default: cpu, unless --model-kwargs has a device_map)",
    )
    group.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "float16", "bfloat16"],
        help="model dtype (default: float32 on CPU, the checkpoint's dtype elsewhere)",
    )
    group.add_argument(
        "--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's)"
    )
    group.add_argument(
        "--trust-remote-code", action="store_true", help="run model code shipped with the checkpoint"
    )
    group.add_argument(
        "--model-kwargs",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="more arguments for the model's from_pretrained, as a JSON object, e.g. "
        '\'{"device_map": "auto", "attn_implementation": "sdpa", "revision": "main"}\'',
    )
    group.add_argument(
        "--tokenizer-kwargs",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="more arguments for the tokenizer's from_pretrained, as a JSON object",
    )
    group.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="variables for the chat template, as a JSON object, e.g. '{\"enable_thinking\": false}' "
        "for Qwen3",
    )
    look = parser.add_argument_group("lookahead")
    defaults = LookaheadConfig()
    look.add_argument(
        "--mode",
        default=defaults.mode,
        choices=["auto", "trie", "jacobi", "off"],
        help="auto: trie drafts, Jacobi n-grams when they pay, cost-aware budget; trie / jacobi: "
        f"that drafter alone, fixed budget; off: plain decoding (default: {defaults.mode})",
    )
    look.add_argument(
        "--decoding-length",
        type=positive_int,
        default=defaults.decoding_length,
        help=f"most draft tokens verified per forward (default: {defaults.decoding_length})",
    )
    look.add_argument(
        "--branch-length",
        type=positive_int,
        default=defaults.branch_length,
        help=f"deepest draft branch (default: {defaults.branch_length})",
    )
    look.add_argument(
        "--draft-policy",
        default=defaults.draft_policy,
        choices=["suffix", "trie"],
        help="suffix: the call's own text first, branches as deep as their match is long, then the "
        f"trie's; trie: the trie's branches only (default: {defaults.draft_policy})",
    )
    look.add_argument(
        "--cpu-linear",
        default=defaults.cpu_linear,
        choices=["auto", "onednn", "reordered", "torch", "packed"],
        help="the kernel of the engine's fp32 linear layers on a CPU: oneDNN's, oneDNN's over a "
        "reordered copy of the weights (reordered; packed is its earlier name), torch's default "
        "as generate runs, or auto: the fastest for this model here, timed at start; the same "
        f"values up to rounding (default: {defaults.cpu_linear})",
    )
    look.add_argument(
        "--step",
        default=defaults.step,
        choices=["auto", "eager", "static", "captured"],
        help="how the batch's steps run: eager, over caches that grow; static, padded to a few "
        "fixed shapes over preallocated slots; captured, those shapes replayed as CUDA graphs; "
        "auto: eager for now (to capture on CUDA once a GPU run has measured it); the same "
        f"outputs every way (default: {defaults.step})",
    )
    look.add_argument(
        "--max-model-len",
        type=positive_int,
        default=defaults.max_model_len,
        help="most tokens of one call (prompt, new tokens and the widest draft) in a static or "
        "captured step's slots; a longer call decodes plainly, alone "
        f"(default: {defaults.max_model_len})",
    )
    look.add_argument(
        "--remeasure",
        action="store_true",
        help="time the forward costs that --mode auto plans with again, replacing the cached ones "
        "(measured once per model, device, dtype and thread count, and kept 30 days); on a quiet "
        "machine: other work running meanwhile makes drafting look dearer than it is",
    )
    add_max_new_tokens(parser, type=positive_int, default=128, help="most tokens per answer (default: 128)")


def _check_settings(args: argparse.Namespace) -> None:
    """Make every config the flags describe, so that a bad combination of values (an overlap
    past the chunk size, drafts too short for the Jacobi n-grams) is refused before anything loads."""
    if hasattr(args, "decoding_length"):
        lookahead_config(args)
    if hasattr(args, "top_k"):
        retrieval_config(args)
    if hasattr(args, "chunk_size"):
        chunking_config(args)
    if getattr(args, "device", None) is not None:  # a --device torch cannot parse ("tpu")
        load_options(args)


def _json_object(text: str) -> dict[str, Any]:
    """A JSON object of keyword arguments (argparse reports the error)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object of keyword arguments is needed, got {text!r}")
    bad = [k for k in value if not k.isidentifier()]
    if bad:
        raise argparse.ArgumentTypeError(f"keys must be argument names, got {bad!r}")
    return value


def _retrieval_flags(parser: argparse.ArgumentParser, *, bench: bool = False) -> None:
    defaults = RetrievalConfig()
    group = parser.add_argument_group("retrieval")
    modes = "dense: embeddings' cosine similarity; keyword: BM25 over words; hybrid: both, fused by rank"
    if bench:
        group.add_argument(
            "--retrieval",
            default="gold",
            choices=["gold", *RETRIEVAL_MODES, "faiss"],
            help="gold: each question with its own context; dense, keyword or hybrid: index every "
            f"context of the file and answer from the top-k retrieved chunks ({modes}; faiss is the "
            "old name of dense) (default: gold)",
        )
    else:
        group.add_argument(
            "--retrieval",
            default=defaults.mode,
            choices=RETRIEVAL_MODES,
            help=f"how chunks are found: {modes} (default: {defaults.mode})",
        )
    add_top_k(
        group,
        type=positive_int,
        default=defaults.top_k,
        help=f"chunks retrieved per question (default: {defaults.top_k})",
    )
    group.add_argument(
        "--min-score",
        type=cosine,
        default=defaults.min_score,
        help="least cosine similarity of a relevant chunk (dense and hybrid; a keyword hit needs a "
        f"shared word) (default: {defaults.min_score})",
    )


def _index_flags(parser: argparse.ArgumentParser) -> None:
    defaults = ChunkingConfig()
    group = parser.add_argument_group("indexing")
    group.add_argument(
        "--chunk-size",
        type=positive_int,
        default=defaults.size,
        help=f"chunk size in --chunk-unit (default: {defaults.size}; the default embedder reads 256 tokens)",
    )
    group.add_argument(
        "--chunk-overlap",
        type=non_negative_int,
        default=defaults.overlap,
        help=f"tokens repeated between neighbouring chunks (default: {defaults.overlap})",
    )
    group.add_argument(
        "--chunk-unit",
        default=defaults.unit,
        choices=["tokens", "sentences"],
        help="pack whole sentences, or cut at any token (default: sentences)",
    )
    group.add_argument(
        "--embedder",
        default=None,
        help="sentence-transformers model directory (default: all-MiniLM-L6-v2 from its wheel)",
    )


_DEBUG_HELP = (
    "mark, per step, the tokens that came from drafts and their source; then count the forwards "
    "without a draft, by why"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rag-lookahead",
        description="Lossless lookahead decoding for RAG answers: faster, token for token the same.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    index = sub.add_parser("index", help="build or update a document index")
    index.add_argument("paths", nargs="+", type=Path, help=".txt, .md, .jsonl files or folders")
    index.add_argument("--out", required=True, type=Path, help="the index directory")
    index.add_argument(
        "--text-field", default="text", help="the text field of .jsonl records (default: text)"
    )
    index.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="also index files of a folder that are links to files outside it (default: skipped, "
        "and listed as skipped)",
    )
    _index_flags(index)
    index.set_defaults(run="answers:run_index")

    ask = sub.add_parser("ask", help="answer one question from an index, streaming, then its sources")
    ask.add_argument("question")
    ask.add_argument("--index", required=True, type=Path, help="an index built by `index`")
    ask.add_argument("--no-lookahead", action="store_true", help="decode plainly, to compare")
    output = ask.add_mutually_exclusive_group()
    output.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (answer, sources, finish_reason, stats) and nothing else on stdout",
    )
    output.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    _retrieval_flags(ask)
    _model_flags(ask)
    ask.set_defaults(run="answers:run_ask")

    chat = sub.add_parser("chat", help="ask questions about an index interactively")
    chat.add_argument("--index", required=True, type=Path, help="an index built by `index`")
    chat.add_argument("--no-lookahead", action="store_true", help="decode plainly, to compare")
    chat.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    _retrieval_flags(chat)
    _model_flags(chat)
    chat.set_defaults(run="answers:run_chat")

    demo = sub.add_parser("demo", help="index the bundled corpus, answer with and without lookahead")
    demo.add_argument(
        "--questions",
        type=positive_int,
        default=None,
        metavar="N",
        help="ask only the first N of the bundled questions (default: all of them)",
    )
    _retrieval_flags(demo)
    _model_flags(demo)
    demo.set_defaults(run="answers:run_demo")

    measure = sub.add_parser(
        "measure",
        help="time the model's forward costs again (what --mode auto plans with) and show them",
        description="Time forwards of every draft size, alone and in batches, replace the cached "
        "costs with them, and print them with the load the machine was under meanwhile. Run it on "
        "a quiet machine: every later command plans with what it measures.",
    )
    _model_flags(measure)
    measure.set_defaults(run="benchmark:run_measure")

    bench = sub.add_parser("bench", help="time greedy, prompt lookup and lookahead on a JSONL set")
    bench.add_argument(
        "--data",
        required=True,
        type=Path,
        help="JSONL with 'question' and 'context', or 'bundled': the demo's corpus and questions, "
        "answered from retrieved chunks",
    )
    bench.add_argument("--limit", type=positive_int, default=None, help="use the first N records")
    bench.add_argument("--json", default=None, help="write the summary here")
    bench.add_argument("--plot", default=None, help="write a PNG chart of the summary here")
    bench.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated subset of {','.join(METHODS)} (default: greedy,prompt_lookup,lookahead; "
        "greedy always runs as the reference), or with --concurrency of "
        f"{','.join(CONCURRENCY_METHODS)} (default: all)",
    )
    bench.add_argument(
        "--concurrency",
        type=client_counts,
        default=None,
        help="comma-separated numbers of concurrent clients, e.g. 1,8: compare serialised and batched "
        "serving with transformers' static and continuous batching",
    )
    bench.add_argument(
        "--arrival-rate",
        type=positive_float,
        default=None,
        help="with --concurrency: questions arrive as a Poisson process at this rate per second "
        "(default: all at once)",
    )
    bench.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="with --concurrency: run the methods this many times each, alternating, and report "
        "the median of each figure (speedups taken within each round)",
    )
    bench.add_argument(
        "--fresh",
        action="store_true",
        help="first-time questions: each asked once on a fresh engine, lookahead against the plain "
        "engine in alternating order, with per-answer ratios",
    )
    bench.add_argument(
        "--cost-curve",
        default=None,
        help="with --fresh: plan against this curve instead of the measured one, as size:cost "
        "pairs (e.g. 1:1,2:1.64,16:2.55 for a steep CPU)",
    )
    _retrieval_flags(bench, bench=True)
    _model_flags(bench)
    bench.set_defaults(run="benchmark:run_bench")

    evaluate = sub.add_parser(
        "eval-retrieval",
        help="recall@1 and recall@4 of each question's own context, per retrieval mode",
        description="Index every context of a JSONL set of 'question' and 'context' records, search "
        "each question in every retrieval mode, and report how often its own context is among the "
        "first 1 and 4 chunks, with the time to build the index and to query it.",
    )
    evaluate.add_argument("--data", required=True, type=Path, help="JSONL with 'question' and 'context'")
    evaluate.add_argument("--limit", type=positive_int, default=None, help="ask the first N questions")
    evaluate.add_argument("--json", default=None, type=Path, help="write the results here")
    evaluate.add_argument(
        "--modes",
        default=",".join(RETRIEVAL_MODES),
        help=f"comma-separated retrieval modes (default: {','.join(RETRIEVAL_MODES)})",
    )
    evaluate.add_argument(
        "--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's)"
    )
    _index_flags(evaluate)
    evaluate.set_defaults(run="benchmark:run_eval_retrieval")

    serve = sub.add_parser(
        "serve",
        help="serve this engine over OpenAI's HTTP API (--backend local, or ray for replicas under "
        "Ray Serve), or print (or run) the vLLM or SGLang server command with speculative settings "
        "for RAG",
    )
    serve.add_argument(
        "--backend",
        required=True,
        choices=SERVE_BACKENDS,
        help="local: this engine behind an OpenAI-compatible server (needs the serve extra); "
        "ray: the same server as --replicas Ray Serve replicas, each with its own engine (needs "
        "the ray and serve extras); vllm or sglang: that serving engine's command",
    )
    serve.add_argument(
        "--model",
        default=None,
        help=f"local and ray: a built-in model ({', '.join(BUILTIN_MODELS)}) or a model directory (default: "
        f"{DEFAULT_MODEL}); vllm and sglang: the model directory (or hub id) to serve (required)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=port, default=8000, help="port to listen on (default: 8000)")
    local = serve.add_argument_group("local and ray backends")
    local.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on /v1 and /metrics (default: ${API_KEY_VARIABLE} "
        "if set, else no key)",
    )
    served = ServeSettings()
    local.add_argument(
        "--max-running",
        type=positive_int,
        default=None,
        help=f"most requests generating at once (default: {served.max_running})",
    )
    local.add_argument(
        "--max-waiting",
        type=non_negative_int,
        default=None,
        help=f"most requests waiting for a running slot; more get 429 (default: {served.max_waiting})",
    )
    local.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=None,
        help=f"largest request body, documents included; larger is 413 (default: {served.max_body_bytes})",
    )
    local.add_argument(
        "--drain-seconds",
        dest="drain_s",
        type=non_negative_float,
        default=None,
        help="on SIGTERM or Ctrl-C, seconds running requests get to finish while new ones (and "
        "/health) get 503; what still runs then is cut, a stream ending with an error event "
        f"(default: {served.drain_s:g})",
    )
    local.add_argument(
        "--header-timeout-seconds",
        dest="header_timeout_s",
        type=positive_float,
        default=None,
        help="seconds a request's headers may take to arrive, from its first byte (a new "
        f"connection's: from its opening); slower, the connection is closed (default: "
        f"{served.header_timeout_s:g}; local only)",
    )
    local.add_argument(
        "--body-timeout-seconds",
        dest="body_timeout_s",
        type=positive_float,
        default=None,
        help="seconds a request's body may take to arrive once its headers are in; slower is 408 "
        f"(default: {served.body_timeout_s:g})",
    )
    local.add_argument(
        "--min-body-rate",
        type=non_negative_int,
        default=None,
        help="bytes a second a request's body must keep up once its grace is over; slower is 408, "
        f"so that a body dripped a byte at a time holds no connection long (0: no minimum; "
        f"default: {served.min_body_rate})",
    )
    local.add_argument(
        "--body-rate-grace-seconds",
        dest="body_rate_grace_s",
        type=non_negative_float,
        default=None,
        help=f"seconds a request's body has before --min-body-rate applies (default: "
        f"{served.body_rate_grace_s:g})",
    )
    local.add_argument(
        "--keep-alive-seconds",
        dest="keep_alive_s",
        type=positive_float,
        default=None,
        help=f"seconds an idle connection stays open (default: {served.keep_alive_s:g}; local only)",
    )
    local.add_argument(
        "--max-connections",
        type=positive_int,
        default=None,
        help=f"most connections open at once; more are answered 503 and closed (default: "
        f"{served.max_connections}; local only)",
    )
    local.add_argument(
        "--corpus-ttl-seconds",
        dest="corpus_ttl_s",
        type=positive_float,
        default=None,
        help="seconds a corpus (POST /v1/corpora) lives unused before it is removed "
        f"(default: {served.corpus_ttl_s:g})",
    )
    local.add_argument(
        "--max-corpora",
        type=positive_int,
        default=None,
        help=f"most corpora alive at once; more get 429 (default: {served.max_corpora})",
    )
    local.add_argument(
        "--max-corpus-bytes",
        type=positive_int,
        default=None,
        help=f"most bytes of documents all corpora hold together (default: {served.max_corpus_bytes})",
    )
    local.add_argument(
        "--embedder",
        default=None,
        help="sentence-transformers model directory /v1/embeddings serves, and its model name there "
        "(default: the built-in all-MiniLM-L6-v2)",
    )
    local.add_argument(
        "--mode",
        default=None,
        choices=["auto", "trie", "jacobi", "off"],
        help=f"drafting, as for `ask` (off: plain decoding) (default: {LookaheadConfig().mode})",
    )
    local.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cpu)")
    local.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "float16", "bfloat16"],
        help="model dtype (default: float32 on CPU, the checkpoint's dtype elsewhere)",
    )
    local.add_argument(
        "--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's)"
    )
    replicated = serve.add_argument_group("ray backend")
    replicated.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        help="replicas, each loading its own engine; requests carry their documents, and corpora "
        "are refused (a corpus would live in one replica) (default: 1)",
    )
    replicated.add_argument(
        "--ray-address",
        default=None,
        help="the Ray cluster to join from one of its nodes, e.g. auto or HEAD:6379 (default: "
        "$RAY_ADDRESS if set, else a new local Ray instance)",
    )
    remote = serve.add_argument_group("vllm and sglang backends")
    remote.add_argument(
        "--python",
        default=None,
        help="interpreter of the environment the backend is installed in (default: python)",
    )
    remote.add_argument(
        "--no-speculation", action="store_true", help="the same server without drafting, to compare"
    )
    remote.add_argument("--launch", action="store_true", help="run the command instead of printing it")
    serve.set_defaults(run="serve:run_serve")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader of stdout left (`| head`): end quietly
        _quiet_stdout()
        return 1


def _main(argv: Sequence[str] | None) -> int:
    from rag_lookahead.progress import PROGRESS_LOGGER

    args = build_parser().parse_args(argv)
    try:
        _check_settings(args)
        with logged_lines(PROGRESS_LOGGER):  # (where no bar is drawn: a file or a pipe)
            code = int(_runner(args.run)(args))
        sys.stdout.flush()  # a closed pipe is found here, not as the interpreter exits
        return code
    # A bad index (IndexFormatError) is a ValueError too.
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"rag-lookahead: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _quiet_stdout() -> None:
    """Point stdout at the null device (Python's recipe for a closed pipe): what it still holds
    is flushed there as the interpreter exits, rather than failing again with a traceback."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # no file descriptor (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _runner(name: str) -> Callable[[argparse.Namespace], int]:
    """The function ``"module:function"`` of this package that runs a command (its module
    imported under a bar the first time: torch and transformers take seconds, tens of them on
    a busy machine, and the command says nothing until they are in)."""
    from rag_lookahead.progress import progress_bar

    module, function = name.split(":")
    path = f"rag_lookahead.cli.{module}"
    fresh = path not in sys.modules
    with progress_bar(fresh, "importing torch and transformers", total=1, unit="step") as bar:
        runner: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(path), function)
        bar.update(1)
    return runner
