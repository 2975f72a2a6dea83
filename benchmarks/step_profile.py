"""Where one decoding step's time goes: plain and lookahead, one row and a full batch, by part.

    python benchmarks/step_profile.py --data dolly_context_qa.jsonl     # SmolLM2, 1 and 8 rows
    python benchmarks/step_profile.py --quick                            # tiny random model, seconds

For plain decoding (``mode="off"``) and lookahead (``--mode``, the default config's) with one
row and with ``--rows`` rows (that many concurrent calls, each streamed through the public
`LookaheadEngine.stream` from a thread of its own, as clients call it), the prompts of
``--data`` (each record's question about its own context, formatted as `benchmarks/vllm_peer.py`
formats them, so that vLLM's side can be read on the same ids) run on a fresh engine until
every row has its first token; then ``--steps`` steps are timed. A step is the span from the
start of one model forward to the start of the next: the forward and all the host work until
the next one. Each configuration runs twice on fresh engines (a fresh trie and prefix cache:
the second run's drafts know nothing of the first's answers), on the same prompts:

- unprofiled: the step's wall time, the CPU time of the thread driving the forwards (its wall
  minus its CPU is time it waited for a core or for another thread) and of the whole process;
- under `torch.profiler` (every thread, Python frames recorded): the step split by `CATEGORIES`.

The split reads each thread's timeline: every torch op's and Python frame's own time goes to
the category of its innermost frame that `RULES` names (by module path, so that it holds while
the engine's modules are reorganised), ops run by the model's output embedding to ``logits``,
SDPA ops to ``attention``, a blocking call (a lock, a queue, an event, a sleep) to nobody.
At every instant the step's time is shared equally among the threads working then; an instant
when every thread waits is ``waiting``. The categories thus sum to the profiled step. The
profiler's Python tracing makes Python slower than ops, so the profiled step is longer than the
unprofiled one (both are reported) and host work's shares are upper bounds.

It prints a Markdown table (milliseconds per step and share of the step, per category and
configuration) and writes the measurements, with the machine's description and per category the
ops and frames that cost most (``top``, to check and refine the attribution), as JSON:
``--out``, by default ``benchmarks/step-profile-<set>.json`` (none with ``--quick`` unless
given). ``--quick`` runs a tiny random model on a few tokens: a check that the script runs,
its figures mean nothing. Run the real thing as one run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from retrieval_build import cpu_name
from torch.profiler import ProfilerActivity, profile

from rag_lookahead import LookaheadConfig, LookaheadEngine, rag_messages
from rag_lookahead.bench.run import fresh_engine, load_records
from rag_lookahead.cli.values import positive_int
from rag_lookahead.prompts import encode_prompt

__all__ = ["CATEGORIES", "RULES", "main", "split_step", "table"]

HERE = Path(__file__).resolve().parent
SAMPLE = HERE.parent / "rag_lookahead" / "data" / "sample.jsonl"
# Each engine's first call, untimed: a prompt sharing no prefix with the timed ones.
WARM_UP = "The weather today is"
# The tiny model reads 512 positions, one per character: its prompts keep their last tokens.
TINY_PROMPT_TOKENS = 256

CATEGORIES: dict[str, str] = {
    "forward": "the model's layers: linear layers, norms, embeddings, rotary (its modeling code)",
    "attention": "attention and its masks: SDPA, the engine's attention, mask building",
    "kv_cache": "KV cache writes and growth: transformers' cache, decoding/{kv_cache,batch,prefix}",
    "logits": "logits and choice: lm_head, argmax or sampling, logits processors, grammar, logprobs",
    "drafting": "rag_lookahead.drafting, the draft tree and the planner",
    "verification": "decoding/verify.py and acceptance",
    "release": "rag_lookahead.streaming: stopping, text, chunks handed to callers",
    "scheduler": "rag_lookahead.engine and the rest of rag_lookahead.decoding: the bookkeeping",
    "other": "frames of none of those: the clients' own loop, the profiler's hook",
    "waiting": "every thread blocked: on a lock, a queue, an event or a sleep",
}

# (module path fragment, category): a frame's own time and everything it calls go to the first
# rule its file matches, unless a frame deeper down matches one of its own. Frames matching none
# (torch, the standard library, tokenizers, transformers' modeling code, the oneDNN kernel's
# function mode) take the category of the frame that called them.
RULES: tuple[tuple[str, str], ...] = (
    ("transformers/cache_utils.py", "kv_cache"),
    ("transformers/masking_utils.py", "attention"),
    ("transformers/modeling_attn_mask_utils.py", "attention"),
    ("transformers/integrations/sdpa_attention.py", "attention"),
    ("transformers/generation/", "logits"),
    ("rag_lookahead/runtime/kv_cache.py", "kv_cache"),
    ("rag_lookahead/runtime/batch.py", "kv_cache"),
    ("rag_lookahead/runtime/prefix.py", "kv_cache"),
    ("rag_lookahead/runtime/attention.py", "attention"),
    ("rag_lookahead/decoding/masks.py", "attention"),
    ("rag_lookahead/runtime/layer_masks.py", "attention"),
    ("rag_lookahead/decoding/argmax.py", "logits"),
    ("rag_lookahead/decoding/constraint.py", "logits"),
    ("rag_lookahead/structured/", "logits"),
    ("rag_lookahead/streaming/logprobs.py", "logits"),
    ("rag_lookahead/decoding/verify.py", "verification"),
    ("rag_lookahead/planning/acceptance.py", "verification"),
    ("rag_lookahead/drafting/", "drafting"),
    ("rag_lookahead/decoding/tree.py", "drafting"),
    ("rag_lookahead/planning/planner.py", "drafting"),
    ("rag_lookahead/streaming/", "release"),
    ("rag_lookahead/runtime/runner.py", "forward"),
    ("rag_lookahead/runtime/kernels.py", ""),  # the linear kernel: whichever layer calls it
    ("rag_lookahead/runtime/threads.py", ""),
    ("rag_lookahead/engine/", "scheduler"),
    ("rag_lookahead/decoding/", "scheduler"),
)
# Python's calls that block the thread, as the profiler names them: C calls (a lock, a queue, a
# sleep) and the threading module's waits (a call blocked when the profiler starts shows as
# its Python frame alone).
BLOCKING = re.compile(
    r"method acquire of _thread\.|method get of _queue\.|function sleep>"
    r"|threading\.py\(\d+\): (wait|join|_wait_for_tstate_lock)$|queue\.py\(\d+\): get$"
)


@dataclass(frozen=True)
class Config:
    """One configuration: how the engine decodes and how many calls run at once."""

    mode: str  # "plain" or "lookahead"
    rows: int

    @property
    def name(self) -> str:
        return f"{self.mode}-{self.rows}"


# ---------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        args.model = "tiny"
        args.steps, args.max_new_tokens = min(args.steps, 4), min(args.max_new_tokens, 24)
    torch.set_num_threads(args.threads)
    with _cache_dir(args.model) as cache_dir:
        loaded = _load(args.model, args.mode, cache_dir)
        records = load_records(args.data, args.limit)
        prompts = _prompts(loaded, records, args.model == "tiny")
        configs = [Config(mode, rows) for mode in ("plain", "lookahead") for rows in (1, args.rows)]
        runs = {c.name: _measure(loaded, c, prompts, args) for c in configs}
    print(table(runs))
    out = args.out or (None if args.quick else HERE / f"step-profile-{args.data.stem}.json")
    if out is not None:
        report = _header(args, loaded, len(records)) | {"categories": CATEGORIES, "runs": runs}
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=SAMPLE,
        help="a JSONL set (question, context); default: the bundled sample",
    )
    parser.add_argument(
        "--limit", type=positive_int, default=8, help="records read (default 8): rows cycle them"
    )
    parser.add_argument(
        "--rows", type=positive_int, default=8, help="calls at once of the batched runs (default 8)"
    )
    parser.add_argument("--steps", type=positive_int, default=24, help="steps profiled per run (default 24)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    parser.add_argument(
        "--model", default="default", help="'default' (SmolLM2), a built-in name or directory, or 'tiny'"
    )
    parser.add_argument(
        "--mode",
        default=LookaheadConfig().mode,
        choices=("auto", "trie", "jacobi"),
        help="drafting mode of the lookahead runs (default: the config's)",
    )
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (default: beside this script)")
    parser.add_argument(
        "--quick", action="store_true", help="tiny random model, 4 steps of 1 thread: a smoke run"
    )
    return parser


@contextmanager
def _cache_dir(model: str) -> Iterator[Path | None]:
    """The default model keeps its cost curves where every process finds them; the tiny random
    one's are thrown away."""
    if model != "tiny":
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="step-profile-") as directory:
        yield Path(directory)


def _load(model: str, mode: str, cache_dir: Path | None) -> LookaheadEngine:
    config = LookaheadConfig(mode=mode)  # type: ignore[arg-type]  # checked by argparse's choices
    if model == "tiny":
        from rag_lookahead.testing.models import ascii_fast_tokenizer, tiny_model

        engine = LookaheadEngine(tiny_model("llama"), ascii_fast_tokenizer(), config, cache_dir=cache_dir)
    else:
        name = None if model == "default" else model
        engine = LookaheadEngine.from_pretrained(name, config=config)
    if mode == "auto":
        engine.measure_costs()
    return engine


def _prompts(engine: LookaheadEngine, records: list[dict[str, str]], tiny: bool) -> list[list[int]]:
    """As `benchmarks/vllm_peer.py` encodes them: the tokenizer's chat template, no engine kwargs."""
    start = -TINY_PROMPT_TOKENS if tiny else 0
    return [
        encode_prompt(engine.tokenizer, rag_messages(r["question"], r["context"]))[start:] for r in records
    ]


# ---------------------------------------------------------------------------------------- runs


def _measure(
    loaded: LookaheadEngine,
    config: Config,
    prompts: list[list[int]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One configuration: unprofiled, then profiled, each on a fresh engine."""
    rows = [prompts[i % len(prompts)] for i in range(config.rows)]
    clean = _run(_fresh(loaded, config), rows, args, profiled=False)
    traced = _run(_fresh(loaded, config), rows, args, profiled=True)
    assert traced.profiler is not None
    split = split_step(traced.profiler, id(loaded.model.get_output_embeddings()))
    result = {
        "mode": "off" if config.mode == "plain" else loaded.config.mode,
        "rows": config.rows,
        **split,
        "step_ms_unprofiled": _round(clean.step_ms),
        "profiler_slowdown": _round(split["step_ms"] / clean.step_ms) if clean.step_ms else None,
        "rows_per_forward": _round(clean.mean_rows),
        "fewest_rows": clean.fewest_rows,
        "width_per_forward": _round(clean.mean_width),
        "tokens_per_row_step": _round(clean.tokens_per_step),
        "driver_cpu_share": _round(clean.driver_cpu_share),
        "process_cores_busy": _round(clean.process_cores_busy),
    }
    print(f"{config.name}: {split['steps']} steps, {split['step_ms']:.1f} ms profiled", file=sys.stderr)
    return result


def _fresh(loaded: LookaheadEngine, config: Config) -> LookaheadEngine:
    """A new engine over the loaded model: its own trie and prefix cache, the measured costs
    read back (as a new process reads them: calibrated by its own steps)."""
    fresh = fresh_engine(loaded, loaded.config)
    engine = fresh.plain() if config.mode == "plain" else fresh
    warm = engine.encode(WARM_UP)
    engine.stream(warm, max_new_tokens=4).complete()
    return engine


# A forward seen beginning: (`time.perf_counter`, thread ident, rows, tokens per row).
Forward = tuple[float, int, int, int]


@dataclass
class Run:
    """What one run of a configuration measured over its steps."""

    forwards: list[Forward] = field(default_factory=list)
    seconds: float = 0.0  # the timed window's wall time
    driver_cpu: float = 0.0
    process_cpu: float = 0.0
    tokens_per_step: float = 0.0
    profiler: Any = None

    @property
    def step_ms(self) -> float:
        times = [f[0] for f in self.forwards]
        return 1000 * (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0

    @property
    def mean_rows(self) -> float:
        return sum(f[2] for f in self.forwards) / max(len(self.forwards), 1)

    @property
    def fewest_rows(self) -> int:
        return min((f[2] for f in self.forwards), default=0)

    @property
    def mean_width(self) -> float:
        return sum(f[3] for f in self.forwards) / max(len(self.forwards), 1)

    @property
    def driver_cpu_share(self) -> float:
        return self.driver_cpu / self.seconds if self.seconds else 0.0

    @property
    def process_cores_busy(self) -> float:
        return self.process_cpu / self.seconds if self.seconds else 0.0


class ForwardClock:
    """Records the model's forwards (a pre-hook) while ``counting``; says when ``target`` have begun."""

    def __init__(self, model: Any, target: int, done: threading.Event) -> None:
        self.counting = False
        self.forwards: list[Forward] = []
        self._target, self._done = target, done
        self._handle = model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self.counting:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        rows, width = ids.shape if ids is not None else (0, 0)  # [B, T]
        self.forwards.append((time.perf_counter(), threading.get_ident(), rows, width))
        if len(self.forwards) >= self._target:
            self._done.set()

    def close(self) -> None:
        self._handle.remove()


def profiler_started() -> None:
    """Called once the profiler runs: its frame marks when it began tracing every thread."""


def _frame_name(function: Callable[..., Any]) -> str:
    """How the profiler ends the name of ``function``'s frames."""
    code = function.__code__
    return f"({code.co_firstlineno}): {code.co_name}"


def _run(engine: LookaheadEngine, prompts: list[list[int]], args: argparse.Namespace, profiled: bool) -> Run:
    """``prompts`` streamed at once, each by a client thread; once every row has its first token,
    ``args.steps`` forwards timed (fewer if every call ends first: rows that end leave the
    batch, as `Run.mean_rows` shows); then every call closed."""
    stop, window = threading.Event(), _Window(len(prompts))
    clients = [_Client(engine, p, args.max_new_tokens, stop, window) for p in prompts]
    clock = ForwardClock(engine.model, args.steps + 1, window.done)
    run = Run()
    try:
        for client in clients:
            client.thread.start()
        for client in clients:
            client.started.wait()
        _raise_failure(clients)
        prof = _profiler() if profiled else None
        if prof is not None:
            prof.start()
            profiler_started()
        threads0, process0, wall0 = _thread_cpu(clients), time.process_time(), time.perf_counter()
        clock.counting = True
        window.done.wait()
        clock.counting = False
        run.seconds = time.perf_counter() - wall0
        run.process_cpu = time.process_time() - process0
        run.driver_cpu = _driver_cpu(threads0, _thread_cpu(clients), clock.forwards)
        if prof is not None:
            prof.stop()
        run.profiler = prof
    finally:
        stop.set()
        for client in clients:
            client.started.set()
            client.thread.join()
        clock.close()
    _raise_failure(clients)
    run.forwards = clock.forwards
    run.tokens_per_step = sum(c.tokens_per_step for c in clients) / len(clients)
    return run


def _profiler() -> Any:
    """Every thread's ops and Python frames, no shapes (a step's own overhead stays small)."""
    try:
        experimental = torch.profiler._ExperimentalConfig(profile_all_threads=True)
    except TypeError as exc:  # the forwards run in whichever client thread reads
        raise SystemExit(
            f"torch {torch.__version__}'s profiler cannot record every thread: a newer torch"
        ) from exc
    return profile(
        activities=[ProfilerActivity.CPU],
        with_stack=True,
        record_shapes=False,
        experimental_config=experimental,
    )


class _Window:
    """Ends the timed window (`done`) once every call has ended or one has failed (or once
    `ForwardClock` has seen its forwards)."""

    def __init__(self, calls: int) -> None:
        self.done = threading.Event()
        self._running = calls
        self._lock = threading.Lock()

    def call_ended(self, failed: bool) -> None:
        with self._lock:
            self._running -= 1
            if failed or not self._running:
                self.done.set()


class _Client:
    """One call streamed from a thread of its own, as a client reads it."""

    def __init__(
        self,
        engine: LookaheadEngine,
        prompt: list[int],
        max_new_tokens: int,
        stop: threading.Event,
        window: _Window,
    ) -> None:
        self.started = threading.Event()  # its first chunk came (its prefill is done), or it failed
        self.ident = 0
        self.failure: BaseException | None = None
        self.tokens_per_step = 0.0
        self._call = functools.partial(engine.stream, prompt, max_new_tokens=max_new_tokens)
        self._stop, self._window = stop, window
        self.thread = threading.Thread(target=self._read, name="step-profile-client")

    def _read(self) -> None:
        self.ident = threading.get_ident()
        try:
            with self._call() as stream:
                for _ in stream.chunks():
                    if not self.started.is_set():
                        self.started.set()
                    if self._stop.is_set():
                        break
                self.tokens_per_step = stream.stats.tokens_per_step
        except BaseException as exc:  # re-raised in the main thread
            self.failure = exc
        finally:
            self.started.set()
            self._window.call_ended(self.failure is not None)


def _raise_failure(clients: list[_Client]) -> None:
    for client in clients:
        if client.failure is not None:
            raise client.failure


def _thread_cpu(clients: list[_Client]) -> dict[int, float]:
    """Each live client thread's CPU seconds so far."""
    seconds = {}
    for client in clients:
        try:
            seconds[client.ident] = time.clock_gettime(time.pthread_getcpuclockid(client.ident))
        except (OSError, ValueError):  # the thread has ended
            continue
    return seconds


def _driver_cpu(before: dict[int, float], after: dict[int, float], forwards: Sequence[Forward]) -> float:
    """The CPU seconds between ``before`` and ``after`` of the thread that ran most of
    ``forwards`` (the loop runs in whichever client reads)."""
    counts = Counter(f[1] for f in forwards)
    driver = counts.most_common(1)[0][0] if counts else None
    return after[driver] - before[driver] if driver in before and driver in after else 0.0


# ---------------------------------------------------------------------------------------- split


def split_step(prof: Any, lm_head: int, top: int = 8) -> dict[str, Any]:
    """The profiled steps split by category: ``steps``, ``step_ms``, per category ``ms`` (the
    step's wall time, shared among the threads working at each instant), ``share`` of the step
    and ``busy_ms`` (every thread's own time in it, unshared); ``top``: see `_top`."""
    roots = prof.profiler.kineto_results.experimental_event_tree()
    hook, started = _frame_name(ForwardClock.hook), _frame_name(profiler_started)
    starts = sorted(e.start_time_ns for e in _walk(roots) if e.name.endswith(hook))
    opened = min((e.start_time_ns for e in _walk(roots) if e.name.endswith(started)), default=0)
    if len(starts) < 2:
        raise SystemExit("fewer than two forwards profiled: give the calls longer answers (--max-new-tokens)")
    begin, end = starts[0], starts[-1]
    steps = len(starts) - 1
    segments = [s for root in roots for s in _segments(root, lm_head, (begin, end), opened)]
    shared, busy = _share(segments, begin, end)
    ms = {c: shared.get(c, 0.0) / steps / 1e6 for c in CATEGORIES}
    step_ms = (end - begin) / steps / 1e6
    return {
        "steps": steps,
        "step_ms": _round(step_ms),
        "ms": {c: _round(v) for c, v in ms.items()},
        "share": {c: _round(v / step_ms) for c, v in ms.items()},
        "busy_ms": {c: _round(busy.get(c, 0.0) / steps / 1e6) for c in CATEGORIES if c != "waiting"},
        "top": _top(segments, steps, top),
    }


def _top(segments: list[Segment], steps: int, top: int) -> dict[str, list[tuple[str, float]]]:
    """Per category, the ``top`` ops and frames by their own time a step (every thread's,
    unshared; blocked time under ``waiting``): what the category holds."""
    own: dict[str, Counter[str]] = defaultdict(Counter)
    for start, stop, _, category, name in segments:
        own[category][name] += stop - start
    return {
        c: [(name, _round(ns / steps / 1e6)) for name, ns in own[c].most_common(top)]
        for c in CATEGORIES
        if c in own
    }


def _walk(roots: Sequence[Any]) -> Iterator[Any]:
    stack = list(roots)
    while stack:
        event = stack.pop()
        yield event
        stack.extend(event.children)


# An event's own time: (start ns, end ns, thread, category, the event's name).
Segment = tuple[int, int, int, str, str]
PENDING = ("waiting", "(a call under way when the profiler began)")


def _segments(root: Any, lm_head: int, window: tuple[int, int], opened: int) -> list[Segment]:
    """Each event's own time (none of its children covers it) within ``window``.

    A frame already running when the profiler began tracing (before ``opened``) may have been
    inside a C call then, which the profiler does not see (a blocked ``queue.get``): its own
    time until its first traced child is counted as waiting."""
    out: list[Segment] = []
    stack = [(root, "other")]
    while stack:
        event, inherited = stack.pop()
        if event.end_time_ns <= window[0] or event.start_time_ns >= window[1]:
            continue
        category = _category(event, inherited, lm_head)
        first = PENDING if event.start_time_ns <= opened else (category, event.name)
        cursor = event.start_time_ns
        for child in sorted(event.children, key=lambda c: c.start_time_ns):
            _add(out, (cursor, child.start_time_ns), event.start_tid, first, window)
            first = (category, event.name)
            cursor = max(cursor, child.end_time_ns)
            stack.append((child, category))
        _add(out, (cursor, event.end_time_ns), event.start_tid, first, window)
    return out


def _add(
    out: list[Segment], span: tuple[int, int], thread: int, what: tuple[str, str], window: tuple[int, int]
) -> None:
    start, stop = max(span[0], window[0]), min(span[1], window[1])
    if stop > start:
        out.append((start, stop, thread, *what))


def _category(event: Any, inherited: str, lm_head: int) -> str:
    """The category of ``event``'s own time, ``inherited`` from its caller unless it names one."""
    name = event.name
    tag = str(event.tag)
    if tag.endswith("TorchOp"):
        return "attention" if "scaled_dot_product" in name else inherited
    if BLOCKING.search(name):
        return "waiting"
    module = getattr(event.extra_fields, "module", None)
    if module is not None:
        return "logits" if module.self_ptr == lm_head else inherited
    for fragment, category in RULES:
        if fragment in name:
            return category or inherited
    return inherited


def _share(segments: list[Segment], begin: int, end: int) -> tuple[dict[str, float], dict[str, float]]:
    """Nanoseconds by category: each instant shared equally among the threads working then
    (``waiting`` when none is), and each thread's own working time summed."""
    changes: list[tuple[int, int, int, str | None]] = []  # (time, 0 ends first at a tie, thread, category)
    busy: dict[str, float] = defaultdict(float)
    for start, stop, thread, category, _name in segments:
        if category == "waiting":
            continue
        busy[category] += stop - start
        changes.append((start, 1, thread, category))
        changes.append((stop, 0, thread, None))
    changes.sort(key=lambda c: (c[0], c[1]))
    shared: dict[str, float] = defaultdict(float)
    working: dict[int, str] = {}
    now = begin
    for time_ns, _order, thread, now_doing in changes:
        _spread(shared, working, time_ns - now)
        now = time_ns
        if now_doing is None:
            working.pop(thread, None)
        else:
            working[thread] = now_doing
    _spread(shared, working, end - now)
    return shared, busy


def _spread(shared: dict[str, float], working: dict[int, str], span: int) -> None:
    if span <= 0:
        return
    if not working:
        shared["waiting"] += span
        return
    for category in working.values():
        shared[category] += span / len(working)


# ---------------------------------------------------------------------------------------- report


def table(runs: dict[str, dict[str, Any]]) -> str:
    """Milliseconds per step and share of the step, a column per configuration."""
    names = list(runs)
    lines = [
        "| per step | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for category in CATEGORIES:
        cells = [f"{r['ms'][category]:.2f} ms ({100 * r['share'][category]:.0f}%)" for r in runs.values()]
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("**step, profiled**", lambda r: f"**{r['step_ms']:.2f} ms**"),
        ("step, unprofiled", lambda r: f"{r['step_ms_unprofiled']:.2f} ms"),
        ("steps profiled", lambda r: str(r["steps"])),
        ("rows x width per forward", lambda r: f"{r['rows_per_forward']:.1f} x {r['width_per_forward']:.1f}"),
        ("tokens per row per step", lambda r: f"{r['tokens_per_row_step']:.2f}"),
        ("driving thread on CPU", lambda r: f"{100 * r['driver_cpu_share']:.0f}%"),
        ("process CPU, cores busy", lambda r: f"{r['process_cores_busy']:.2f}"),
    ]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in runs.values()) + " |")
    return "\n".join(lines)


def _header(args: argparse.Namespace, engine: LookaheadEngine, records: int) -> dict[str, Any]:
    return {
        "benchmark": "step_profile",
        "set": args.data.stem,
        "model": Path(engine.model_name).name,
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "commit": commit_id(),
        "threads": args.threads,
        "records": records,
        "rows": args.rows,
        "steps": args.steps,
        "max_new_tokens": args.max_new_tokens,
        "quick": args.quick,
    }


def commit_id() -> str | None:
    """This checkout's commit, ``-dirty`` when its files differ from it."""
    out = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=40"],
        cwd=HERE,
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or None


def _round(value: float) -> float:
    return round(value, 3)


if __name__ == "__main__":
    sys.exit(main())
