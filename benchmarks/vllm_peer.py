"""Peer benchmark: vLLM's CPU build (plain, ``ngram``, ``suffix``) and this engine, same prompts.

Every method answers the same token-id prompts — each record's question about its own context,
formatted as `rag-lookahead bench` formats them (`rag_messages`, the model's chat template) —
greedily, first one at a time (single stream), then all at once from ``--clients`` threads.
vLLM gets the ids on its ``/completions`` endpoint through `ServerEngine`, from a server this
script starts for each method and stops after it (one at a time, in fp32 like the local engine);
this engine runs in this process. Each method's answers are compared with its own engine's plain
greedy answers alone: vLLM's speculative servers with the plain vLLM server, the local engine
with its `plain()` twin. Run it as one timing run on an otherwise idle machine:

    python benchmarks/vllm_peer.py --vllm-python VENV/bin/python --data a.jsonl --data b.jsonl

It writes ``vllm-peer-<set>.json`` for each data file into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rag_lookahead import LookaheadEngine, rag_messages
from rag_lookahead.bench.run import load_records
from rag_lookahead.decoding.threads import in_passing_thread
from rag_lookahead.models import default_model_dir
from rag_lookahead.prompts import encode_prompt
from rag_lookahead.server import ServerEngine, SpeculationCounters
from rag_lookahead.server.process import running_server

# The speculative settings: `rag-lookahead serve`'s ngram ones, and suffix decoding's defaults.
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 16}
VLLM_METHODS: dict[str, dict[str, Any] | None] = {
    "vllm_plain": None,
    "vllm_ngram": NGRAM,
    "vllm_suffix": SUFFIX,
}
LOCAL_METHODS = ("local_plain", "local_lookahead")
METHODS = (*VLLM_METHODS, *LOCAL_METHODS)
SERVER_ARGS = ["--max-model-len", "4096", "--dtype", "float32"]

Prompts = list[list[int]]
# Each engine's first call, untimed: a prompt sharing no prefix with the timed ones.
WARM_UP = "The weather today is"
Answer = Callable[[list[int]], tuple[str, int]]  # prompt ids -> (text, new tokens)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    model = str(default_model_dir())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    sets = {Path(p).stem: _prompts(tokenizer, Path(p), args.limit) for p in args.data}
    warm = tokenizer(WARM_UP).input_ids
    results: dict[str, dict[str, Any]] = {name: {} for name in sets}
    for method in args.methods:
        runs = (
            _vllm(method, model, sets, warm, args)
            if method in VLLM_METHODS
            else _local(method, sets, warm, args)
        )
        for name, run in runs.items():
            results[name][method] = run
            _print_row(name, method, run)
    for name, methods in results.items():
        _mark_identical(methods)
        path = args.out_dir / f"vllm-peer-{name}.json"
        path.write_text(json.dumps(_header(args, model, name) | {"methods": methods}, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", action="append", required=True, help="a JSONL set (question, context)")
    parser.add_argument("--limit", type=int, default=8, help="records of each set (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the local engine")
    parser.add_argument("--vllm-python", help="the interpreter of vLLM's environment")
    parser.add_argument("--methods", type=lambda s: s.split(","), default=list(METHODS))
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent)
    parser.add_argument("--log-dir", type=Path, default=Path("vllm-peer-logs"), help="the servers' logs")
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds for a server to start")
    return parser


def _prompts(tokenizer: Any, path: Path, limit: int) -> Prompts:
    return [
        encode_prompt(tokenizer, rag_messages(r["question"], r["context"])) for r in load_records(path, limit)
    ]


# ---------------------------------------------------------------------------------------- vLLM


def _vllm(
    method: str, model: str, sets: dict[str, Prompts], warm: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    """Every phase starts from nothing cached or learned: one server for the whole run, its
    prefix cache emptied before each phase (a start compiles the model for minutes), except
    for suffix decoding, whose tree of past responses only a fresh server empties."""
    if args.vllm_python is None:
        raise SystemExit("--vllm-python is needed for the vLLM methods")
    phases = [(name, phase, clients) for name in sets for phase, clients in _phases(args)]
    groups = [[p] for p in phases] if method == "vllm_suffix" else [phases]
    runs: dict[str, Any] = {name: {} for name in sets}
    for group in groups:
        with _server(method, model, args) as engine:

            def answer(ids: list[int], engine: ServerEngine = engine) -> tuple[str, int]:
                completion = engine.complete(ids, max_new_tokens=args.max_new_tokens)
                return completion.text, completion.stats.new_tokens

            answer(warm)  # the first request's one-off costs
            for name, phase, clients in group:
                _reset_prefix_cache(engine)
                before = engine.speculation_counters()
                run = _timed(answer, sets[name], clients)
                run["speculation"] = _counters(engine.speculation_counters() - before)
                runs[name][phase] = run
    return runs


def _phases(args: argparse.Namespace) -> tuple[tuple[str, int], ...]:
    return (("single", 1), ("concurrent", args.clients))


def _reset_prefix_cache(engine: ServerEngine) -> None:
    """vLLM's development endpoint (``VLLM_SERVER_DEV_MODE=1``); an error if it fails."""
    request = urllib.request.Request(f"{engine.config.root_url}/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        if response.status != 200:
            raise RuntimeError(f"the server did not empty its prefix cache: HTTP {response.status}")


@contextmanager
def _server(method: str, model: str, args: argparse.Namespace) -> Iterator[ServerEngine]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    command += ["--host", "127.0.0.1", "--port", str(port), *SERVER_ARGS]
    spec = VLLM_METHODS[method]
    if spec is not None:
        command += ["--speculative-config", json.dumps(spec)]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_SERVER_DEV_MODE": "1",  # for /reset_prefix_cache
    }
    root = f"http://127.0.0.1:{port}"
    log = args.log_dir / f"{method}.log"
    with running_server(command, root, log, start_timeout=args.start_timeout, env=env):
        yield ServerEngine(base_url=f"{root}/v1", model=model, kind="vllm", timeout=600)


def _counters(run: SpeculationCounters) -> dict[str, Any]:
    return {
        "drafts": run.drafts,
        "draft_tokens": run.draft_tokens,
        "accepted_tokens": run.accepted_tokens,
        "acceptance_rate": round(run.acceptance_rate, 3),
        "tokens_per_step": round(run.tokens_per_step, 3),
    }


# ---------------------------------------------------------------------------------------- local


def _local(
    method: str, sets: dict[str, Prompts], warm: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    """Each set and phase on a fresh engine over the same model: a trie and prefix cache of its
    own (it keeps the acceptance statistics and cost curves learned on disk, as any process)."""
    loaded = in_passing_thread(LookaheadEngine.from_pretrained)
    in_passing_thread(loaded.measure_costs)
    runs: dict[str, Any] = {}
    for name, prompts in sets.items():
        runs[name] = {}
        for phase, clients in _phases(args):
            fresh = LookaheadEngine(
                loaded.model, loaded.tokenizer, loaded.config, cost_curve=loaded.cost_curve
            )
            engine = fresh.plain() if method == "local_plain" else fresh
            in_passing_thread(engine.measure_costs)  # read back from the disk cache

            def answer(ids: list[int], engine: LookaheadEngine = engine) -> tuple[str, int]:
                completion = engine.complete(ids, max_new_tokens=args.max_new_tokens)
                return completion.text, completion.stats.new_tokens

            in_passing_thread(lambda answer=answer: answer(warm))
            # In threads that end with the phase: no OpenMP team outlives it.
            runs[name][phase] = in_passing_thread(lambda a=answer, p=prompts, c=clients: _timed(a, p, c))
    return runs


# ---------------------------------------------------------------------------------------- timing


def _timed(answer: Answer, prompts: Prompts, clients: int) -> dict[str, Any]:
    """Every prompt answered by ``clients`` threads taking them in order; wall-clock totals."""
    texts: list[str] = [""] * len(prompts)
    tokens = [0] * len(prompts)
    seconds = [0.0] * len(prompts)
    queue = iter(range(len(prompts)))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                i = next(queue, None)
            if i is None:
                return
            start = time.perf_counter()
            texts[i], tokens[i] = answer(prompts[i])
            seconds[i] = time.perf_counter() - start

    started = time.perf_counter()
    if clients == 1:
        client()
    else:
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    wall = time.perf_counter() - started
    return {
        "clients": clients,
        "wall_seconds": round(wall, 3),
        "new_tokens": sum(tokens),
        "tokens_per_s": round(sum(tokens) / wall, 2),
        "answer_seconds": [round(s, 3) for s in seconds],
        "texts": texts,
    }


def _mark_identical(methods: dict[str, Any]) -> None:
    """Each phase's answers against its engine's plain single-stream answers."""
    for method, run in methods.items():
        reference = methods.get("vllm_plain" if method in VLLM_METHODS else "local_plain")
        if reference is None:
            continue
        expected = reference["single"]["texts"]
        for phase in run.values():
            phase["identical_to_own_greedy"] = sum(
                a == b for a, b in zip(phase["texts"], expected, strict=True)
            )
    if "vllm_plain" in methods and "local_plain" in methods:
        pairs = zip(
            methods["vllm_plain"]["single"]["texts"], methods["local_plain"]["single"]["texts"], strict=True
        )
        methods["vllm_plain"]["identical_to_local_plain"] = sum(a == b for a, b in pairs)


def _header(args: argparse.Namespace, model: str, name: str) -> dict[str, Any]:
    return {
        "benchmark": "vllm_peer",
        "set": name,
        "model": Path(model).name,
        "dtype": "float32",
        "cpu": _cpu_name(),
        "python": platform.python_version(),
        "local_threads": args.threads,
        "records": args.limit,
        "max_new_tokens": args.max_new_tokens,
        "clients": args.clients,
        "vllm": _vllm_version(args.vllm_python),
        "speculative_configs": {k: v for k, v in VLLM_METHODS.items() if k in args.methods},
    }


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    return platform.processor()


def _vllm_version(python: str | None) -> str | None:
    if python is None:
        return None
    code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    return (
        subprocess.run([python, "-c", code], capture_output=True, text=True, check=False).stdout.strip()
        or None
    )


def _print_row(name: str, method: str, run: dict[str, Any]) -> None:
    single, concurrent = run["single"], run["concurrent"]
    print(
        f"{name:<24} {method:<16} single {single['tokens_per_s']:7.1f} tok/s   "
        f"{concurrent['clients']} clients {concurrent['tokens_per_s']:7.1f} tok/s",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
