"""Peer benchmark: vLLM's CPU build and this engine, in process and over HTTP, on the same prompts.

vLLM runs plain, with ``ngram`` or with ``suffix`` speculation; this engine plain or with lookahead.

Every method answers the same token-id prompts — each record's question about its own context,
formatted as `rag-lookahead bench` formats them (`rag_messages`, the model's chat template) —
greedily, streamed, in three phases: one client at a time (``single``), ``--clients`` clients at
once (``concurrent``: each sends its next prompt when its answer is done) and, with
``--arrival-rate``, requests arriving as a seeded Poisson process (``poisson``: each request
sent at its arrival time from a thread of its own, at most ``--max-in-flight`` at once).
The servers (vLLM's, and this engine's ``local_server``: `rag-lookahead serve --backend local`
on the same model, dtype, drafting mode and thread count as ``local_lookahead``) are started by
this script in processes of their own on 127.0.0.1 and get the ids on ``/completions`` through
`ServerEngine`; ``local_plain`` and ``local_lookahead`` run this engine in this process. Each
phase gives tokens/s (all new tokens over the wall clock), p50/p95 request latency, p50/p95 time
to first token (the first streamed chunk) and how many answers equal the same engine's plain
greedy single-stream answers: vLLM's speculative servers against the plain vLLM server, this
engine (in process or served) against ``local_plain``. With ``local_server`` and
``local_lookahead`` both run, ``http_overhead`` compares their tokens/s at ``--clients``. This
process keeps the memory it frees and reserves its engine's working set
(`rag_lookahead.runtime.memory`), as ``rag-lookahead serve`` does on CPU. The JSON records
what each side ran with: ``vllm``, vLLM's version, platform and each method's configuration as
its server builds it (runner, attention backend, GEMM, compilation and CUDA graphs, batching,
chunked prefill, prefix caching, speculation; `vllm_facts.py`, run by vLLM's interpreter), and
what each server's start-up log and ``/version`` said; ``engine``, this engine's `Backend`
(in process) and its server's ``/version``. A fact not read is ``null``, and ``unknown`` says
why. Run it as one timing run on an otherwise idle machine:

    python benchmarks/vllm_peer.py --vllm-python VENV/bin/python --data a.jsonl --data b.jsonl \
        --arrival-rate 0.4 --methods vllm_ngram,local_plain,local_lookahead,local_server

It writes ``vllm-peer-<set>.json`` for each data file into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from retrieval_build import cpu_name

from rag_lookahead import LookaheadConfig, LookaheadEngine, rag_messages
from rag_lookahead.bench.concurrency import poisson_arrivals, quantile
from rag_lookahead.bench.run import fresh_engine, load_records
from rag_lookahead.cli.values import positive_float, positive_int
from rag_lookahead.interface import Engine
from rag_lookahead.models import default_model_dir
from rag_lookahead.prompts import encode_prompt
from rag_lookahead.remote import ServerEngine, SpeculationCounters
from rag_lookahead.remote.config import ServerKind
from rag_lookahead.remote.process import running_server
from rag_lookahead.runtime.memory import reserve_heap, retain_freed_memory, working_set_bytes

# The speculative settings: `rag-lookahead serve`'s ngram ones, and suffix decoding's defaults.
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 16}
VLLM_METHODS: dict[str, dict[str, Any] | None] = {
    "vllm_plain": None,
    "vllm_ngram": NGRAM,
    "vllm_suffix": SUFFIX,
}
LOCAL_METHODS = ("local_plain", "local_lookahead")
LOCAL_SERVER = "local_server"
HTTP_METHODS = (*VLLM_METHODS, LOCAL_SERVER)
METHODS = (*VLLM_METHODS, *LOCAL_METHODS, LOCAL_SERVER)
SERVER_ARGS = ["--max-model-len", "4096", "--dtype", "float32"]
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_SERVER_DEV_MODE": "1",  # for /reset_prefix_cache
}
FACTS_SCRIPT = Path(__file__).with_name("vllm_facts.py")

Prompts = list[list[int]]
# What each method ran on, as its engine or server said: one record a server start, or the engine.
Started = dict[str, list[dict[str, Any]]]
# Each engine's first call, untimed: a prompt sharing no prefix with the timed ones.
WARM_UP = "The weather today is"


class Phase(NamedTuple):
    """``clients`` threads taking the prompts in order, each sent at once, or at its arrival
    time of a Poisson process of ``arrival_rate`` per second."""

    name: str
    clients: int
    arrival_rate: float | None = None


@dataclass
class Request:
    """One prompt's answer; times from `time.perf_counter`."""

    sent: float = 0.0
    first_chunk: float = 0.0
    done: float = 0.0
    text: str = ""
    new_tokens: int = 0


Ask = Callable[[list[int], Request], None]  # streams the answer to the prompt ids into the request


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    retain_freed_memory()  # before the engine's thread starts, as `rag-lookahead serve` does
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; choose from {','.join(METHODS)}")
    torch.set_num_threads(args.threads)
    model = args.model or str(default_model_dir())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    sets = {Path(p).stem: prompts_of(tokenizer, Path(p), args.limit) for p in args.data}
    warm = tokenizer(WARM_UP).input_ids
    results: dict[str, dict[str, Any]] = {name: {} for name in sets}
    started: Started = {}
    for method in args.methods:
        runs = (
            _over_http(method, model, sets, warm, args, started)
            if method in HTTP_METHODS
            else _local(method, sets, warm, args, started)
        )
        for name, run in runs.items():
            results[name][method] = run
    runners = _runners(args, model, started)
    for name, methods in results.items():
        _mark_identical(methods)
        overhead = _http_overhead(methods)
        print(_table(name, methods, overhead), flush=True)
        summary = {"methods": methods} | ({"http_overhead": overhead} if overhead else {})
        path = args.out_dir / f"vllm-peer-{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_header(args, model, name) | runners | summary, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", action="append", required=True, help="a JSONL set (question, context)")
    parser.add_argument("--limit", type=positive_int, default=8, help="records of each set (default 8)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--clients", type=positive_int, default=8, help="concurrent clients (default 8)")
    parser.add_argument(
        "--arrival-rate",
        type=positive_float,
        default=None,
        help="requests per second of the poisson phase (default: no poisson phase)",
    )
    parser.add_argument("--seed", type=int, default=0, help="of the poisson arrivals (default 0)")
    parser.add_argument(
        "--max-in-flight", type=positive_int, default=32, help="most poisson requests at once (default 32)"
    )
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads of this engine")
    parser.add_argument("--vllm-python", help="the interpreter of vLLM's environment")
    parser.add_argument("--model", help="a model directory (default: the default model, converted)")
    parser.add_argument(
        "--methods",
        type=lambda s: s.split(","),
        default=list(METHODS),
        help=f"comma-separated, from {','.join(METHODS)} (default: all)",
    )
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent)
    parser.add_argument("--log-dir", type=Path, default=Path("vllm-peer-logs"), help="the servers' logs")
    parser.add_argument(
        "--start-timeout", type=positive_float, default=900.0, help="seconds for a server to start"
    )
    return parser


def prompts_of(tokenizer: Any, path: Path, limit: int) -> Prompts:
    """The first ``limit`` records of ``path`` as `rag-lookahead bench` asks them, as token ids."""
    return [
        encode_prompt(tokenizer, rag_messages(r["question"], r["context"])) for r in load_records(path, limit)
    ]


def _phases(args: argparse.Namespace) -> list[Phase]:
    phases = [Phase("single", 1), Phase("concurrent", args.clients)]
    if args.arrival_rate is not None:
        phases.append(Phase("poisson", args.max_in_flight, args.arrival_rate))
    return phases


# ---------------------------------------------------------------------------------------- HTTP


def _over_http(
    method: str,
    model: str,
    sets: dict[str, Prompts],
    warm: list[int],
    args: argparse.Namespace,
    started: Started,
) -> dict[str, Any]:
    """Every phase starts from nothing cached or learned. vLLM: one server for the whole run,
    its prefix cache emptied before each phase (a start compiles the model for minutes),
    except for suffix decoding, whose tree of past responses only a fresh server empties. This
    engine's server: a fresh one for each phase, as the in-process engine gets (it starts in
    seconds)."""
    vllm = method in VLLM_METHODS
    if vllm and args.vllm_python is None:
        raise SystemExit("--vllm-python is needed for the vLLM methods")
    phases = [(name, phase) for name in sets for phase in _phases(args)]
    groups = [[p] for p in phases] if method in ("vllm_suffix", LOCAL_SERVER) else [phases]
    runs: dict[str, Any] = {name: {} for name in sets}
    for group in groups:
        log = args.log_dir / f"{_log_name(method, group)}.log"
        with _server(method, model, args, log) as engine:
            version = _version_of(engine)
            ask = asker(engine, args.max_new_tokens)
            ask(warm, Request())  # the first request's one-off costs
            for name, phase in group:
                before = _speculation(engine, vllm)
                run = timed(ask, sets[name], phase, args.seed)
                if before is not None:
                    run["speculation"] = _counters(engine.speculation_counters() - before)
                runs[name][phase.name] = run
                _progress(name, method, phase, run)
        said = startup_facts(log.read_text(encoding="utf-8", errors="replace")) if vllm else {}
        started.setdefault(method, []).append({"log": log.name, "/version": version} | said)
    return runs


def _version_of(engine: ServerEngine) -> dict[str, Any] | str:
    """The server's ``GET /version`` (vLLM's version; this engine's version and backend), or
    why there is none."""
    try:
        with urllib.request.urlopen(f"{engine.config.root_url}/version", timeout=60) as response:
            answer: dict[str, Any] = json.load(response)
            return answer
    except (OSError, ValueError) as error:
        return f"unread: {type(error).__name__}: {error}"


def _log_name(method: str, group: list[tuple[str, Phase]]) -> str:
    return method if len(group) > 1 else f"{method}-{group[0][0]}-{group[0][1].name}"


def _speculation(engine: ServerEngine, vllm: bool) -> SpeculationCounters | None:
    """vLLM's counters before a phase, its prefix cache emptied first (``None`` for this engine)."""
    if not vllm:
        return None
    _reset_prefix_cache(engine)
    return engine.speculation_counters()


def _reset_prefix_cache(engine: ServerEngine) -> None:
    """vLLM's development endpoint (``VLLM_SERVER_DEV_MODE=1``); an error if it fails."""
    request = urllib.request.Request(f"{engine.config.root_url}/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        if response.status != 200:
            raise RuntimeError(f"the server did not empty its prefix cache: HTTP {response.status}")


@contextmanager
def _server(method: str, model: str, args: argparse.Namespace, log: Path) -> Iterator[ServerEngine]:
    """The method's server on a free loopback port, stopped when the block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command, env = (
        _local_server_command(model, port, args)
        if method == LOCAL_SERVER
        else _vllm_command(method, model, port, args)
    )
    root = f"http://127.0.0.1:{port}"
    with running_server(
        command, root, log, start_timeout=args.start_timeout, env=env | {"HF_HUB_OFFLINE": "1"}
    ):
        kind: ServerKind = "openai" if method == LOCAL_SERVER else "vllm"
        yield ServerEngine(base_url=f"{root}/v1", model=model, kind=kind, timeout=600)


def _vllm_command(
    method: str, model: str, port: int, args: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    command = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    command += ["--host", "127.0.0.1", "--port", str(port), *SERVER_ARGS]
    spec = VLLM_METHODS[method]
    if spec is not None:
        command += ["--speculative-config", json.dumps(spec)]
    return command, VLLM_ENV


def _local_server_command(
    model: str, port: int, args: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    """`rag-lookahead serve --backend local` as ``local_lookahead`` runs in process."""
    command = [sys.executable, "-m", "rag_lookahead", "serve", "--backend", "local", "--model", model]
    command += ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    command += ["--mode", LookaheadConfig().mode, "--threads", str(args.threads)]
    return command, {}


def _counters(run: SpeculationCounters) -> dict[str, Any]:
    return {
        "drafts": run.drafts,
        "draft_tokens": run.draft_tokens,
        "accepted_tokens": run.accepted_tokens,
        "acceptance_rate": round(run.acceptance_rate, 3),
        "tokens_per_step": round(run.tokens_per_step, 3),
    }


# ---------------------------------------------------------------------------------------- local


def loaded_engine(clients: int, model: str | None = None) -> LookaheadEngine:
    """The built-in model (or ``model``) as ``rag-lookahead serve`` sets it up on a CPU (after
    `retain_freed_memory`): its costs read back or measured, the working set of ``clients``
    running calls reserved. Its forwards all run in its model's thread."""
    loaded = LookaheadEngine.from_pretrained(model)
    loaded.measure_costs()
    reserve_heap(working_set_bytes(loaded.model, clients, loaded.config.prefix_cache_mb << 20))
    return loaded


def _local(
    method: str, sets: dict[str, Prompts], warm: list[int], args: argparse.Namespace, started: Started
) -> dict[str, Any]:
    """Each set and phase on a fresh engine over the same model: a trie and prefix cache of its
    own (it keeps the acceptance statistics and cost curves learned on disk, as any process)."""
    loaded = loaded_engine(args.clients, args.model)
    started[method] = [{"backend": loaded.backend.as_dict()}]
    runs: dict[str, Any] = {}
    for name, prompts in sets.items():
        runs[name] = {}
        for phase in _phases(args):
            fresh = fresh_engine(loaded, loaded.config)  # its costs read back from the disk cache
            engine = fresh.plain() if method == "local_plain" else fresh
            ask = asker(engine, args.max_new_tokens)
            ask(warm, Request())
            run = timed(ask, prompts, phase, args.seed)
            runs[name][phase.name] = run
            _progress(name, method, phase, run)
    return runs


# ---------------------------------------------------------------------------------------- timing


def asker(engine: Engine, max_new_tokens: int) -> Ask:
    """Greedy answers, streamed: the first chunk's time is the time to first token."""

    def ask(ids: list[int], request: Request) -> None:
        with engine.stream(ids, max_new_tokens=max_new_tokens) as stream:
            for chunk in stream.chunks():
                if not request.first_chunk and (chunk.text or chunk.token_ids):
                    request.first_chunk = time.perf_counter()
            request.done = time.perf_counter()
            request.text, request.new_tokens = stream.text, stream.stats.new_tokens

    return ask


def timed(ask: Ask, prompts: Prompts, phase: Phase, seed: int) -> dict[str, Any]:
    """Every prompt answered by the phase's client threads taking them in order, each sent when
    taken, or in the poisson phase at its arrival time (its latency counted from then, also
    when every thread was busy); wall-clock totals."""
    arrivals = poisson_arrivals(len(prompts), phase.arrival_rate, seed)
    requests = [Request() for _ in prompts]
    queue = iter(range(len(prompts)))
    lock = threading.Lock()
    started = time.perf_counter()

    def client() -> None:
        while True:
            with lock:
                i = next(queue, None)
            if i is None:
                return
            due = started + arrivals[i]
            time.sleep(max(0.0, due - time.perf_counter()))
            requests[i].sent = due if phase.arrival_rate is not None else time.perf_counter()
            ask(prompts[i], requests[i])

    clients = min(phase.clients, len(prompts))
    if clients == 1:
        client()  # in this thread, as an application asking alone would
    else:
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return _measures(requests, phase, time.perf_counter() - started)


def _measures(requests: list[Request], phase: Phase, wall: float) -> dict[str, Any]:
    tokens = sum(r.new_tokens for r in requests)
    latency = [r.done - r.sent for r in requests]
    ttft = [r.first_chunk - r.sent if r.first_chunk else r.done - r.sent for r in requests]
    ranked, first = sorted(latency), sorted(ttft)
    return {
        **(
            {"clients": phase.clients}
            if phase.arrival_rate is None
            else {"arrival_rate": phase.arrival_rate, "max_in_flight": phase.clients}
        ),
        "wall_seconds": round(wall, 3),
        "new_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2),
        "p50_latency_s": round(quantile(ranked, 0.5), 3),
        "p95_latency_s": round(quantile(ranked, 0.95), 3),
        "p50_ttft_s": round(quantile(first, 0.5), 3),
        "p95_ttft_s": round(quantile(first, 0.95), 3),
        "answer_seconds": [round(s, 3) for s in latency],
        "ttft_seconds": [round(s, 3) for s in ttft],
        "texts": [r.text for r in requests],
    }


# ---------------------------------------------------------------------------------------- report


def _mark_identical(methods: dict[str, Any]) -> None:
    """Each phase's answers against its engine's plain single-stream answers, and vLLM's also
    against this engine's (``local_plain``)."""
    for method, run in methods.items():
        vllm = method in VLLM_METHODS
        own = _same(run, methods.get("vllm_plain" if vllm else "local_plain"))
        for name, count in own.items():
            run[name]["identical_to_own_greedy"] = count
        for name, count in (_same(run, methods.get("local_plain")) if vllm else {}).items():
            run[name]["identical_to_local_plain"] = count


def _same(run: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, int]:
    """Per phase, the answers equal to the reference's single-stream answers (none without one)."""
    if reference is None:
        return {}
    expected = reference["single"]["texts"]
    return {
        name: sum(a == b for a, b in zip(phase["texts"], expected, strict=True))
        for name, phase in run.items()
    }


def _http_overhead(methods: dict[str, Any]) -> dict[str, Any] | None:
    """This engine's tokens/s over HTTP against in process, with the concurrent clients."""
    if LOCAL_SERVER not in methods or "local_lookahead" not in methods:
        return None
    served, local = methods[LOCAL_SERVER]["concurrent"], methods["local_lookahead"]["concurrent"]
    ratio = served["tokens_per_s"] / local["tokens_per_s"]
    return {
        "clients": served["clients"],
        "local_server_tokens_per_s": served["tokens_per_s"],
        "local_lookahead_tokens_per_s": local["tokens_per_s"],
        "ratio": round(ratio, 4),
        "overhead_percent": round(100 * (1 - ratio), 2),
    }


def _header(args: argparse.Namespace, model: str, name: str) -> dict[str, Any]:
    return {
        "benchmark": "vllm_peer",
        "set": name,
        "model": Path(model).name,
        "dtype": "float32",
        "cpu": f"{cpu_name()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "local_threads": args.threads,
        "records": args.limit,
        "max_new_tokens": args.max_new_tokens,
        "clients": args.clients,
        "arrival_rate": args.arrival_rate,
        "arrival_seed": args.seed,
        "max_in_flight": args.max_in_flight,
        "phases": [phase.name for phase in _phases(args)],
        "speculative_configs": {k: v for k, v in VLLM_METHODS.items() if k in args.methods},
    }


def _runners(args: argparse.Namespace, model: str, started: Started) -> dict[str, Any]:
    """What each side ran with: vLLM's version, platform and per-method configuration
    (`vllm_facts`) with what its servers said at start-up; this engine's backend, in process
    and as its server reported it."""
    methods = {k: v for k, v in VLLM_METHODS.items() if k in args.methods}
    vllm = None
    if methods and args.vllm_python is not None:
        vllm = vllm_facts(args.vllm_python, model, methods)
        vllm["servers"] = {m: started[m] for m in methods if m in started}
    engine = {m: started[m] for m in (*LOCAL_METHODS, LOCAL_SERVER) if m in started}
    return {"vllm": vllm, "engine": engine}


def vllm_facts(
    python: str, model: str, methods: dict[str, dict[str, Any] | None], timeout: float = 600.0
) -> dict[str, Any]:
    """`vllm_facts.py` run by vLLM's interpreter on the servers' arguments and environment:
    its version, platform and each method's configuration; where it fails, every fact ``None``
    and ``unknown`` says why (a record with gaps, never a failed benchmark)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "facts.json"
        command = [python, str(FACTS_SCRIPT), "--model", model, "--methods", json.dumps(methods)]
        command += ["--out", str(out), "--", *SERVER_ARGS]
        env = os.environ | VLLM_ENV | {"HF_HUB_OFFLINE": "1"}
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
            if out.exists():
                facts: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
                return facts
            why = f"exit {done.returncode}: {done.stderr.strip()[-500:]}"
        except (OSError, ValueError, subprocess.TimeoutExpired) as error:
            why = f"{type(error).__name__}: {error}"
    return {"version": None, "platform": None, "methods": dict.fromkeys(methods), "unknown": {"all": why}}


# A line of vLLM's start-up log, and what it states.
_ENGINE_CONFIG = re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\) with config: (.*)$", re.MULTILINE)
_CONFIG_KEYS = ("dtype", "max_seq_len", "enforce_eager", "kv_cache_dtype")
_CONFIG_FLAGS = ("enable_prefix_caching", "enable_chunked_prefill")
_COMPILATION = {
    "compilation_mode": r"'mode': <CompilationMode\.(\w+)",
    "compilation_backend": r"'backend': '([^']*)'",
    "cudagraph_mode": r"'cudagraph_mode': <CUDAGraphMode\.(\w+)",
}
_BACKEND = re.compile(r"\bUsing (\w+) backend\.")
_WARNING = re.compile(r"\bWARNING\b[^\]]*\] (.*)$", re.MULTILINE)


def startup_facts(log: str) -> dict[str, Any]:
    """What a vLLM server's start-up log states: the version and configuration of its engine
    (its ``Initializing a V1 LLM engine`` line), the attention backend where it names one (on a
    CPU only the MLA backends are logged: ``None`` there), the V2 model runner, its warnings.
    A fact the log does not state is ``None``, and ``unknown`` says so."""
    facts: dict[str, Any] = {"version": None, "attention_backend": None}
    unknown: dict[str, str] = {}
    engine = _ENGINE_CONFIG.search(log)
    if engine is None:
        unknown["config"] = "no 'Initializing a V1 LLM engine' line in the log"
    else:
        facts["version"], config = engine.group(1), engine.group(2)
        for key in _CONFIG_KEYS:
            found = re.search(rf"\b{key}=([^,]+)", config)
            facts[key] = found.group(1) if found else None
        for key in _CONFIG_FLAGS:
            found = re.search(rf"\b{key}=(True|False)\b", config)
            facts[key] = found.group(1) == "True" if found else None
        for key, pattern in _COMPILATION.items():
            found = re.search(pattern, config)
            facts[key] = found.group(1) if found else None
    backend = _BACKEND.search(log)
    if backend is None:
        unknown["attention_backend"] = "not logged (vLLM logs only the MLA backends it picks on a CPU)"
    else:
        facts["attention_backend"] = backend.group(1)
    facts["v2_model_runner"] = "Using V2 Model Runner" in log
    facts["warnings"] = sorted({line.strip()[:300] for line in _WARNING.findall(log)})
    return facts | ({"unknown": unknown} if unknown else {})


def _progress(name: str, method: str, phase: Phase, run: dict[str, Any]) -> None:
    print(f"{name} {method} {phase.name}: {run['tokens_per_s']:.1f} tok/s", flush=True)


def _table(name: str, methods: dict[str, Any], overhead: dict[str, Any] | None) -> str:
    head = f"{name:<18}{'phase':<12}{'tok/s':>8}{'p50 s':>8}{'p95 s':>8}{'ttft50':>8}{'ttft95':>8}"
    head += f"{'same':>7}{'=local':>7}"
    lines = ["", head, "-" * len(head)]
    for method, run in methods.items():
        for phase, m in run.items():
            lines.append(
                f"{method:<18}{phase:<12}{m['tokens_per_s']:>8.1f}{m['p50_latency_s']:>8.2f}"
                f"{m['p95_latency_s']:>8.2f}{m['p50_ttft_s']:>8.2f}{m['p95_ttft_s']:>8.2f}"
                f"{_count(m, 'identical_to_own_greedy'):>7}{_count(m, 'identical_to_local_plain'):>7}"
            )
    if overhead is not None:
        lines.append(
            f"HTTP overhead at {overhead['clients']} clients: {overhead['overhead_percent']:.1f}% "
            f"(local_server {overhead['local_server_tokens_per_s']} tok/s, "
            f"local_lookahead {overhead['local_lookahead_tokens_per_s']} tok/s)"
        )
    return "\n".join(lines)


def _count(measures: dict[str, Any], key: str) -> str:
    return f"{measures[key]}/{len(measures['texts'])}" if key in measures else "-"


if __name__ == "__main__":
    sys.exit(main())
