"""Predicted Outputs on editing: a file, an instruction for a small change, the file as the prediction.

    python benchmarks/predicted_outputs.py --out benchmarks/predicted-outputs-cpu.json
    python benchmarks/predicted_outputs.py --quick          # tiny random model, seconds

Each task is an excerpt of a real file: a module of the standard library of the Python that
runs this script, or one of this repository's own sources (provenance in the report: path,
first line, lines, sha256, and the Python version or the commit). The prompt asks for a small
edit (a rename, a type hint) and for the whole edited code back; the prediction is the excerpt
as it is, as OpenAI's Predicted Outputs are meant to be used.

Single stream, one task at a time (the methods' order rotates per task): greedy ``generate``,
transformers' prompt lookup (``prompt_lookup_num_tokens``), and this engine (``--mode``) without
and with the prediction. Eight clients (``--clients``) at once through the batched engine:
plain decoding (``mode="off"``), lookahead without and with the prediction; prompt lookup
decodes one sequence at a time, so its figure there is its single-stream one (the clients served
one after another). Every answer is compared with greedy ``generate``'s, token for token; the
report says how many are identical and where any other leaves it. The engines are fresh per
method: none drafts from another's answers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from retrieval_build import cpu_name
from step_profile import commit_id

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.bench.divergence import divergences
from rag_lookahead.bench.run import PROMPT_LOOKUP_TOKENS, fresh_engine, hf_generate, run_header
from rag_lookahead.cli.values import positive_int

__all__ = ["TASKS", "Task", "main"]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WARM_UP = [{"role": "user", "content": "Say hello."}]
QUICK_LINES = 6  # the tiny model reads 512 positions: its excerpts are the first lines


@dataclass(frozen=True)
class Task:
    """An excerpt (``lines`` lines from the first that starts with ``start``) of ``path``, in the
    standard library (``source="stdlib"``) or this repository, and the edit asked of it."""

    source: str
    path: str
    start: str
    lines: int
    instruction: str

    def file(self) -> Path:
        root = Path(sysconfig.get_paths()["stdlib"]) if self.source == "stdlib" else REPO
        return root / self.path

    def excerpt(self, lines: int | None = None) -> tuple[str, dict[str, Any]]:
        """The excerpt's text and its provenance."""
        text = self.file().read_text(encoding="utf-8").splitlines(keepends=True)
        first = next(i for i, line in enumerate(text) if line.lstrip().startswith(self.start))
        code = "".join(text[first : first + (lines or self.lines)])
        where = {"python": platform.python_version()} if self.source == "stdlib" else {"commit": commit_id()}
        provenance = {
            "source": self.source,
            "path": self.path,
            "first_line": first + 1,
            "lines": code.count("\n"),
            "sha256": hashlib.sha256(code.encode()).hexdigest(),
            **where,
        }
        return code, provenance


TASKS = (
    Task(
        "stdlib", "colorsys.py", "def rgb_to_yiq", 30, "Rename the function rgb_to_yiq to rgb_to_yiq_color."
    ),
    Task("stdlib", "bisect.py", "def insort_right", 30, "Rename the parameter lo to low everywhere."),
    Task("stdlib", "textwrap.py", "def dedent", 40, "Rename the variable margin to common_margin."),
    Task("stdlib", "heapq.py", "def heappush", 30, "Add the return annotation -> None to heappush."),
    Task("stdlib", "fnmatch.py", "def fnmatch(", 30, "Rename the function fnmatch to match_name."),
    Task(
        "repo",
        "rag_lookahead/drafting/trie_drafter.py",
        "class TrieDrafter",
        40,
        "Rename min_match to min_length.",
    ),
    Task(
        "repo",
        "rag_lookahead/protocol/deadline.py",
        "def within_deadline",
        26,
        "Rename within_deadline to under_deadline.",
    ),
    Task(
        "repo",
        "rag_lookahead/drafting/protocol.py",
        "class Drafter",
        19,
        "Rename the class Drafter to DraftSource.",
    ),
)


@dataclass(frozen=True)
class Item:
    """One task as every method sees it."""

    prompt_ids: list[int]
    prediction: str


@dataclass
class Totals:
    """One method's answers and what they took, over all items."""

    seconds: float = 0.0
    steps: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    outputs: list[list[int]] = field(default_factory=list)


Answer = Callable[[Item], tuple[list[int], Any]]  # tokens, and the call's stats (None: generate's)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        args.tasks, args.max_new_tokens, args.clients = min(args.tasks, 2), min(args.max_new_tokens, 24), 2
    args.mode = args.mode or ("trie" if args.quick else "auto")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="predicted-outputs-") as scratch:
        start = time.perf_counter()
        engine = _load(args, Path(scratch))
        _progress("loaded, costs measured", start)
        tasks = TASKS[: args.tasks]
        excerpts = [task.excerpt(QUICK_LINES if args.quick else None) for task in tasks]
        items = [_item(engine, task, code) for task, (code, _) in zip(tasks, excerpts, strict=True)]
        single, greedy = _single_stream(engine, items, args.max_new_tokens)
        clients = min(args.clients, len(items))
        together = _together(engine, items, args.max_new_tokens, clients, single, greedy)
    report = {
        **run_header(engine, len(items), args.max_new_tokens),
        "benchmark": "predicted_outputs",
        "cpu": cpu_name(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "commit": commit_id(),
        "mode": args.mode,
        "quick": args.quick,
        "tasks": [
            {"instruction": task.instruction, **provenance}
            for task, (_, provenance) in zip(tasks, excerpts, strict=True)
        ],
        "single_stream": single,
        f"clients_{clients}": together,
    }
    for title, methods in (("single stream", single), (f"{clients} clients", together)):
        print(f"{title}:")
        for name, figures in methods.items():
            print(
                f"  {name:22} {figures['tokens_per_s']:8.2f} tokens/s  x{figures['speedup_vs_greedy']:.2f}"
                f"  identical {figures['identical_to_greedy']}/{len(items)}"
            )
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")
    identical = all(m["identical_to_greedy"] == len(items) for m in (*single.values(), *together.values()))
    return 0 if identical else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tasks", type=positive_int, default=len(TASKS), help=f"the first N tasks (of {len(TASKS)})"
    )
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--clients", type=positive_int, default=8, help="calls at once (default 8)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    parser.add_argument(
        "--mode",
        choices=("auto", "trie"),
        help="the engine's drafting mode (default auto; trie with --quick)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the JSON report, e.g. benchmarks/predicted-outputs-cpu.json"
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny random model, 2 tasks, 24 tokens: a smoke run"
    )
    return parser


def _load(args: argparse.Namespace, scratch: Path) -> LookaheadEngine:
    """The default model (its costs measured, or read from the cache), or in ``--quick`` the
    tiny random one with its costs kept in ``scratch``."""
    config = LookaheadConfig(mode=args.mode, max_batch_size=max(args.clients, 8))
    if args.quick:
        from rag_lookahead.testing.models import ascii_fast_tokenizer, tiny_model

        engine = LookaheadEngine(tiny_model("llama"), ascii_fast_tokenizer(), config, cache_dir=scratch)
    else:
        engine = LookaheadEngine.from_pretrained(config=config)
    engine.measure_ahead()
    return engine


def _item(engine: LookaheadEngine, task: Task, code: str) -> Item:
    request = f"{task.instruction} Reply with the whole edited code only.\n\n```python\n{code}```"
    return Item(engine.encode([{"role": "user", "content": request}]), code)


# ---------------------------------------------------------------------------- runs


def _single_stream(
    engine: LookaheadEngine, items: list[Item], n: int
) -> tuple[dict[str, Any], list[list[int]]]:
    """Each method's figures, one item at a time, and greedy ``generate``'s answers."""
    without, predicted = fresh_engine(engine, engine.config), fresh_engine(engine, engine.config)
    answers: dict[str, Answer] = {
        "greedy": lambda item: (hf_generate(engine, item.prompt_ids, n), None),
        "prompt_lookup": lambda item: (
            hf_generate(engine, item.prompt_ids, n, prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS),
            None,
        ),
        "lookahead": lambda item: _complete(without, item, n, None),
        "lookahead+prediction": lambda item: _complete(predicted, item, n, item.prediction),
    }
    for answer in answers.values():  # first-call costs (allocations, the probe), untimed
        answer(Item(engine.encode(WARM_UP), "Hello."))
    totals = {name: Totals() for name in answers}
    names = list(answers)
    for i, item in enumerate(items):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter()
            tokens, stats = answers[name](item)
            _add(totals[name], time.perf_counter() - start, tokens, stats)
            _progress(f"task {i + 1}/{len(items)} {name}: {len(tokens)} tokens", start)
    greedy = totals["greedy"].outputs
    return _figures(engine, items, totals, greedy), greedy


def _together(
    engine: LookaheadEngine,
    items: list[Item],
    n: int,
    clients: int,
    single: dict[str, Any],
    greedy: list[list[int]],
) -> dict[str, Any]:
    """The engine's variants with ``clients`` calls at once, and prompt lookup's single-stream
    figures; speedups are over greedy ``generate``'s single stream."""
    variants = {
        "plain": (replace(engine.config, mode="off"), False),
        "lookahead": (engine.config, False),
        "lookahead+prediction": (engine.config, True),
    }
    totals: dict[str, Totals] = {}
    for name, (config, with_prediction) in variants.items():
        variant = fresh_engine(engine, config)  # (its batch costs read back too)
        _complete(variant, Item(variant.encode(WARM_UP), "Hello."), n, None)
        start = time.perf_counter()
        totals[name] = _clients(variant, items, n, clients, with_prediction)
        _progress(f"{clients} clients {name}", start)
    figures = _figures(engine, items, totals, greedy, single["greedy"]["tokens_per_s"])
    return {**figures, "prompt_lookup": {**single["prompt_lookup"], "note": "one sequence at a time"}}


def _clients(
    engine: LookaheadEngine, items: list[Item], n: int, clients: int, with_prediction: bool
) -> Totals:
    """``items`` answered by ``clients`` threads, each taking the next as it finishes one."""
    results: list[tuple[list[int], Any]] = [([], None)] * len(items)
    queue = iter(range(len(items)))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                i = next(queue, None)
            if i is None:
                return
            item = items[i]
            results[i] = _complete(engine, item, n, item.prediction if with_prediction else None)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    totals = Totals()
    for tokens, stats in results:
        _add(totals, 0.0, tokens, stats)
    totals.seconds = time.perf_counter() - start
    return totals


def _progress(what: str, start: float) -> None:
    print(f"# {what} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def _complete(engine: LookaheadEngine, item: Item, n: int, prediction: str | None) -> tuple[list[int], Any]:
    completion = engine.complete(item.prompt_ids, max_new_tokens=n, prediction=prediction)
    return completion.token_ids, completion.stats


def _add(totals: Totals, seconds: float, tokens: list[int], stats: Any) -> None:
    totals.seconds += seconds
    totals.outputs.append(tokens)
    if stats is not None:
        totals.steps += stats.steps
        totals.accepted_prediction_tokens += stats.accepted_prediction_tokens
        totals.rejected_prediction_tokens += stats.rejected_prediction_tokens


def _figures(
    engine: LookaheadEngine,
    items: list[Item],
    totals: dict[str, Totals],
    greedy: list[list[int]],
    greedy_rate: float | None = None,
) -> dict[str, Any]:
    """Each method's tokens per second, its ratio to greedy ``generate``'s (``greedy_rate``, or
    the ``"greedy"`` method's), and how its answers compare with ``greedy``."""
    prompts = [item.prompt_ids for item in items]
    rates = {name: sum(map(len, t.outputs)) / t.seconds for name, t in totals.items()}
    base = greedy_rate if greedy_rate is not None else rates["greedy"]
    figures: dict[str, Any] = {}
    for name, t in totals.items():
        tokens = sum(map(len, t.outputs))
        figures[name] = {
            "seconds": round(t.seconds, 3),
            "new_tokens": tokens,
            "tokens_per_s": round(rates[name], 3),
            "speedup_vs_greedy": round(rates[name] / base, 3),
            "identical_to_greedy": sum(a == b for a, b in zip(t.outputs, greedy, strict=True)),
            "divergences": divergences(engine, prompts, t.outputs, greedy),
        }
        if t.steps:
            figures[name]["tokens_per_step"] = round((tokens - len(items)) / t.steps, 3)
        if name.endswith("+prediction"):
            figures[name]["accepted_prediction_tokens"] = t.accepted_prediction_tokens
            figures[name]["rejected_prediction_tokens"] = t.rejected_prediction_tokens
    return figures


if __name__ == "__main__":
    sys.exit(main())
