"""How cost grows: with the context, the answer's length and the trie's size.

Part one times plain greedy `generate` and this engine on the same prompts, one axis at a time
from a base point (1,024-token context, 128-token answers, a trie of 10^4 output nodes):
tokens/s, speedup, draft time per step, the prompt's trie insert per document, the KV cache's
bytes and the trie's. Answers ignore the end-of-sequence token (both methods alike), so every
answer has its set length. Part two runs the trie alone at 10^4 / 10^5 / 10^6 nodes and counts
its work, which no load on the machine changes.

    python benchmarks/scaling.py --data llma_msmarco_rag.jsonl piarena_rag_qa.jsonl \
        --json benchmarks/scaling.json
    python benchmarks/scaling.py --data ... --quick   # a tiny random model and a small grid

The first file gives the prompts (each record's question over its own context, then the next
records' contexts up to the length); every context no prompt uses fills the trie as the
outputs of a long-running server would.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import resource
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
from soak import tiny_engine  # benchmarks/ is the script's own folder, first on sys.path

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.bench.run import hf_generate, load_records, run_header
from rag_lookahead.drafting import OUTPUT_OWNER, TokenTrie
from rag_lookahead.drafting.trie import Node, TrieDraft
from rag_lookahead.drafting.trie_nodes import draft_candidates
from rag_lookahead.prompts import rag_messages
from rag_lookahead.runtime.kv_cache import with_room


@dataclass(frozen=True)
class Point:
    """One grid point: prompt tokens, answer tokens, output nodes in the trie beforehand."""

    context: int
    answer: int
    trie: int


@dataclass(frozen=True)
class Grid:
    base: Point
    contexts: tuple[int, ...]
    answers: tuple[int, ...]
    tries: tuple[int, ...]
    records: int

    def points(self) -> list[tuple[str, Point]]:
        """The base point, then each axis varied alone."""
        base = self.base
        out = [("base", base)]
        out += [("context", replace(base, context=c)) for c in self.contexts if c != base.context]
        out += [("answer", replace(base, answer=a)) for a in self.answers if a != base.answer]
        out += [("trie", replace(base, trie=t)) for t in self.tries if t != base.trie]
        return out


# "8k" is the window (8,192) less the answer asked at that context and room for a draft.
FULL = Grid(
    Point(1024, 128, 10_000),
    (1024, 2048, 4096, 8192 - 128 - 64),
    (128, 512, 1024),
    (10_000, 100_000, 1_000_000),
    2,
)
QUICK = Grid(Point(256, 32, 2_000), (256, 512), (32, 64), (2_000, 10_000), 1)
SMALLEST = Grid(Point(96, 8, 300), (96,), (8,), (300,), 1)  # (the tests' run, on a tiny model)
T = TypeVar("T")
TRIE_SIZES = {"full": (10_000, 100_000, 1_000_000), "quick": (2_000, 10_000, 50_000), "smallest": (300, 600)}


class TimedTrie(TokenTrie):
    """A `TokenTrie` that adds up the time and number of its ``insert`` and ``draft`` calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reset()

    def reset(self) -> None:
        self.inserts, self.insert_s, self.drafts, self.draft_s = 0, 0.0, 0, 0.0

    def insert(self, tokens: Sequence[int], owner: str, *, starts: int | None = None) -> None:
        start = time.perf_counter()
        super().insert(tokens, owner, starts=starts)
        self.insert_s += time.perf_counter() - start
        self.inserts += 1

    def draft(self, context: Sequence[int], owner: str | None, budget: int, min_match: int = 1) -> Any:
        start = time.perf_counter()
        draft = super().draft(context, owner, budget, min_match)
        self.draft_s += time.perf_counter() - start
        self.drafts += 1
        return draft


class Texts:
    """The data set's records as token ids: prompt material and the filler of output tries."""

    def __init__(self, engine: LookaheadEngine, paths: Sequence[Path], prompt_records: int) -> None:
        records = load_records(paths[0])
        if len(records) < prompt_records + 1:
            raise ValueError(f"{paths[0]} holds {len(records)} records; the grid needs {prompt_records + 1}")
        self.records = records[:prompt_records]
        used = {r["context"] for r in self.records}
        rest = [r["context"] for path in paths for r in load_records(path)]
        tokenize = engine.tokenizer
        other = [tokenize(c)["input_ids"] for c in dict.fromkeys(rest) if c not in used and c.strip()]
        self.held, self.filler = other[-4:], other[:-4]  # held: answers no trie has seen

    def prompt(self, engine: LookaheadEngine, first: int, tokens: int) -> list[int]:
        """Record ``first``'s question over its context and the next ones', cut to ``tokens``."""
        question = self.records[first]["question"]
        overhead = len(engine.encode(rag_messages(question, "")))
        contexts = [r["context"] for r in self.records[first:]] + [r["context"] for r in self.records[:first]]
        ids = engine.tokenizer("\n\n".join(contexts))["input_ids"]
        if len(ids) < tokens - overhead:
            raise ValueError(
                f"the first {len(self.records)} records hold {len(ids)} context tokens, not {tokens}"
            )
        keep = tokens - overhead
        for _ in range(4):  # decoding then encoding a cut moves its length by a few tokens
            prompt = engine.encode(rag_messages(question, engine.tokenizer.decode(ids[:keep])))
            if len(prompt) <= tokens:
                return prompt
            keep -= len(prompt) - tokens
        return prompt[:tokens]

    def fill(self, trie: TokenTrie, nodes: int) -> int:
        """Insert filler documents as outputs until ``trie`` holds ``nodes``; the trie's bytes."""
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for doc in self.filler:
            start = 0
            while start < len(doc) and len(trie) < nodes:
                # A token adds at most ngram_length nodes: pieces that cannot overshoot by much.
                end = start + max(32, (nodes - len(trie)) // trie.ngram_length)
                trie.insert(doc[start:end], OUTPUT_OWNER)
                start = end
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        if len(trie) < nodes:
            raise ValueError(
                f"the data files fill only {len(trie)} trie nodes, not {nodes}: pass more --data files"
            )
        return grown


def room_for(config: LookaheadConfig, nodes: int, tokens: int) -> int:
    """A node cap that holds ``nodes`` outputs and a call's ``tokens``' n-grams twice over, so
    that no prune runs while a point is measured (a call adds up to ``ngram_length`` nodes a token)."""
    return 2 * nodes + 2 * (config.max_query_length + config.branch_length) * tokens


def kv_bytes_per_token(engine: LookaheadEngine) -> float:
    """Bytes of keys and values one cached token takes, read off a real cache."""
    ids = torch.arange(16, device=engine.device)[None]  # (1, 16)
    with torch.inference_mode():
        cache = engine.model(ids, use_cache=True).past_key_values
    total = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    return total / ids.shape[1]


def kv_allocated_tokens(prompt: int, answer: int) -> int:
    """Columns the engine's growing cache holds at the end: its growth rule replayed (one
    token at a time; a step adds up to a draft's worth, so this is within a draft of exact)."""
    room = with_room(prompt)
    for used in range(prompt + 1, prompt + answer + 1):
        if used > room:
            room = with_room(used)
    return room


def timed(run: Callable[[], T]) -> tuple[T, float]:
    begin = time.perf_counter()
    result = run()
    return result, time.perf_counter() - begin


def run_point(
    engine: LookaheadEngine, texts: Texts, point: Point, grid: Grid, kv_token: float
) -> dict[str, Any]:
    config = replace(
        engine.config, max_trie_nodes=room_for(engine.config, point.trie, point.context + point.answer)
    )
    trie = TimedTrie(config.max_query_length, config.branch_length, config.max_trie_nodes)
    # The same model and costs over a trie of the point's size (as `bench.run.fresh_engine`).
    variant = LookaheadEngine(
        engine.model,
        engine.tokenizer,
        config,
        trie,
        cost_curve=engine.cost_curve,
        cache_dir=engine.cache_dir,
        model_thread=engine.runner.thread,
    )
    if config.mode == "auto" and engine.cost_curve is not None:
        variant.measure_costs()  # read back, as a new process would
    trie_bytes = texts.fill(trie, point.trie)
    trie.reset()
    start_nodes = len(trie)
    greedy_s = engine_s = prefill_s = 0.0
    new = steps = identical = natural = 0
    for n in range(grid.records):
        prompt = texts.prompt(engine, n * max(1, len(texts.records) // grid.records), point.context)
        ask = functools.partial(variant.complete, prompt, max_new_tokens=point.answer, eos_token_id=())
        if n % 2:  # who goes first alternates, so that a busy machine slows both alike
            done, done_s = timed(ask)
        greedy, seconds = timed(
            functools.partial(hf_generate, engine, prompt, point.answer, eos_token_id=None)
        )
        if n % 2 == 0:
            done, done_s = timed(ask)
        greedy_s += seconds
        engine_s += done_s
        identical += done.token_ids == greedy
        new += len(done.token_ids)
        steps += done.stats.steps
        prefill_s += done.stats.prefill_seconds
        ends = [i for i, t in enumerate(greedy) if t in engine.eos_token_ids]
        natural += ends[0] if ends else len(greedy)
    used_kv = kv_token * (point.context + point.answer)
    return {
        "prompt_tokens": point.context,
        "answer_tokens": point.answer,
        "trie_nodes_before": start_nodes,
        "trie_nodes_after": len(trie),
        "records": grid.records,
        "identical_to_greedy": identical,
        "answer_tokens_before_first_eos": round(natural / grid.records, 1),
        "greedy_tokens_per_s": round(new / greedy_s, 2),
        "lookahead_tokens_per_s": round(new / engine_s, 2),
        "speedup_vs_greedy": round(greedy_s / engine_s, 3),
        # The engine's time to its first token stands for the prefill both methods run.
        "decode_speedup_vs_greedy": round((greedy_s - prefill_s) / (engine_s - prefill_s), 3),
        "prefill_s_per_record": round(prefill_s / grid.records, 3),
        "tokens_per_step": round((new - grid.records) / steps, 3) if steps else None,
        "draft_us_per_step": round(1e6 * trie.draft_s / trie.drafts, 1) if trie.drafts else None,
        "draft_share_of_step": round(trie.draft_s / (engine_s - prefill_s), 4),
        "insert_ms_per_document": round(1000 * trie.insert_s / trie.inserts, 2) if trie.inserts else None,
        "kv_bytes_used": round(used_kv),
        "kv_bytes_allocated": round(kv_token * kv_allocated_tokens(point.context, point.answer)),
        "trie_bytes_before": trie_bytes,
        "process_peak_rss_mib_so_far": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def matched_node(trie: TokenTrie, context: Sequence[int], length: int) -> Node:
    node = trie.root
    for token in context[len(context) - length :]:
        node = node.children[token]
    return node


def children_read(anchor: Node, draft: TrieDraft, room: int) -> int:
    """Children the draft examined: those offered at its matched node and at each node it
    took (counted with the whole budget as room, so an upper bound below the first node)."""
    nodes = [anchor]
    for token, parent in zip(draft.tokens, draft.parents, strict=True):
        nodes.append((anchor if parent == -1 else nodes[parent + 1]).children[token])
    return sum(len(list(draft_candidates(node, room))) for node in nodes)


def trie_alone(
    texts: Texts, sizes: Sequence[int], prompts: Sequence[list[int]], answers: Sequence[list[int]]
) -> list[dict[str, Any]]:
    """The trie without the model at each size: bytes, insert, draft, prune, a full collection."""
    rows: list[dict[str, Any]] = []
    config = LookaheadConfig()
    for size in sizes:
        cap = room_for(config, size, max(map(len, prompts)) + max(map(len, answers)))
        trie = TokenTrie(config.max_query_length, config.branch_length, cap)
        trie_bytes = texts.fill(trie, size)
        rows.append({"nodes": len(trie), "bytes_per_node": round(trie_bytes / len(trie))})
        rows[-1] |= calls_on(trie, config, prompts, answers)
        nodes = len(trie)
        pruned, prune_s = timed(functools.partial(trie.prune, int(nodes * 0.75)))
        _, collect_s = timed(gc.collect)
        rows[-1] |= {
            "prune_to_three_quarters_ms": round(1000 * prune_s, 1),
            "pruned_nodes": pruned,
            "full_gc_ms": round(1000 * collect_s, 1),
            "gc_tracked_objects": len(gc.get_objects()),
        }
        print(json.dumps(rows[-1]), flush=True)
        del trie
    return rows


def calls_on(
    trie: TokenTrie, config: LookaheadConfig, prompts: Sequence[list[int]], answers: Sequence[list[int]]
) -> dict[str, float]:
    """Calls as the engine makes them: each prompt inserted, a draft after every token of its
    answer, the prompt eliminated. Times, and the counts behind them."""
    inserts, draft_s, children, read, drafted, visits, steps = [], 0.0, 0, 0, 0, 0, 0
    for j, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        inserts.append(timed(functools.partial(trie.insert, prompt, f"q{j}"))[1])
        visits += sum(min(trie.ngram_length, len(prompt) - i) for i in range(len(prompt)))
        for k in range(len(answer)):
            context = prompt + answer[:k]
            ask = functools.partial(
                trie.draft, context, f"q{j}", config.decoding_length, config.min_query_length
            )
            draft, seconds = timed(ask)
            draft_s += seconds
            steps += 1
            if draft.match_length:
                anchor = matched_node(trie, context, draft.match_length)
                children += len(anchor.children)
                read += children_read(anchor, draft, config.decoding_length)
                drafted += len(draft.tokens)
        trie.eliminate(f"q{j}")
    insert_s = statistics.median(inserts)
    return {
        "insert_ms_per_document": round(1000 * insert_s, 2),
        "node_visits_per_document": visits // len(prompts),
        "insert_ns_per_node_visit": round(1e9 * insert_s * len(prompts) / visits, 1),
        "draft_us_per_step": round(1e6 * draft_s / steps, 1),
        "matched_node_children_per_step": round(children / steps, 1),
        "children_read_per_step": round(read / steps, 1),
        "draft_tokens_per_step": round(drafted / steps, 2),
    }


class PruneCounter(TokenTrie):
    """A `TokenTrie` that counts its prunes."""

    prunes = 0

    def prune(self, target: int | None = None) -> int:
        self.prunes += 1
        return super().prune(target)


def crowded(texts: Texts, calls: int, tokens: int) -> dict[str, Any]:
    """``calls`` prompts of ``tokens`` each at once in a trie of the default cap: how often it
    prunes, and how much of the first call's own n-grams it keeps."""
    config = LookaheadConfig()
    trie = PruneCounter(config.max_query_length, config.branch_length, config.max_trie_nodes)
    stream = [token for doc in texts.filler for token in doc][: calls * tokens]
    if len(stream) < calls * tokens:
        raise ValueError(f"the data files hold {len(stream)} filler tokens, not {calls * tokens}")
    trie.insert(stream[:tokens], "call0")
    alone = trie.count_owned("call0")
    for n in range(1, calls):
        trie.insert(stream[n * tokens : (n + 1) * tokens], f"call{n}")
    row = {
        "max_trie_nodes": config.max_trie_nodes,
        "calls": calls,
        "prompt_tokens": tokens,
        "nodes_of_one_prompt": alone,
        "prunes": trie.prunes,
        "first_call_nodes_kept": round(trie.count_owned("call0") / alone, 3),
    }
    print(json.dumps(row), flush=True)
    return row


POINT_COLUMNS = {
    "axis": "axis",
    "prompt_tokens": "context",
    "answer_tokens": "answer",
    "trie_nodes_before": "trie nodes",
    "greedy_tokens_per_s": "greedy tok/s",
    "lookahead_tokens_per_s": "lookahead tok/s",
    "speedup_vs_greedy": "speedup",
    "decode_speedup_vs_greedy": "decode speedup",
    "tokens_per_step": "tokens per step",
    "prefill_s_per_record": "prefill s",
    "draft_us_per_step": "draft µs/step",
    "draft_share_of_step": "draft share of decode",
    "insert_ms_per_document": "insert ms/prompt",
    "kv_bytes_allocated": "KV MiB (allocated)",
    "trie_bytes_before": "trie MiB",
    "identical_to_greedy": "identical",
}
TRIE_COLUMNS = {
    "nodes": "nodes",
    "bytes_per_node": "bytes/node",
    "node_visits_per_document": "node visits per prompt",
    "insert_ns_per_node_visit": "ns per visit",
    "matched_node_children_per_step": "matched node's children",
    "children_read_per_step": "children read per step",
    "draft_tokens_per_step": "draft tokens per step",
    "draft_us_per_step": "draft µs/step",
    "prune_to_three_quarters_ms": "prune to 3/4 ms",
    "full_gc_ms": "full gc ms",
}


def markdown(rows: Sequence[dict[str, Any]], columns: dict[str, str]) -> str:
    """``rows`` as a Markdown table of ``columns`` (bytes in MiB)."""

    def cell(key: str, value: Any) -> str:
        mib = key.endswith("bytes_allocated") or key.startswith("trie_bytes")
        return f"{value / 2**20:.1f}" if mib else str(value)

    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(k, row.get(k)) for k in columns) + " |" for row in rows]
    return "\n".join(lines)


def print_tables(report: dict[str, Any]) -> None:
    if "points" in report:
        print(markdown(report["points"], POINT_COLUMNS) + "\n")
    print(markdown(report["trie_alone"], TRIE_COLUMNS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, nargs="+")
    parser.add_argument("--table", type=Path, help="print the Markdown tables of a report written before")
    parser.add_argument("--quick", action="store_true", help="a tiny random model and a small grid")
    parser.add_argument("--smallest", action="store_true", help="the smallest grid (4 prompt records)")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--trie-only", action="store_true", help="part two only (no model timing)")
    parser.add_argument("--records", type=int, default=None, help="prompts per point (default: 2; quick: 1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.table:
        print_tables(json.loads(args.table.read_text(encoding="utf-8")))
        return
    if not args.data:
        parser.error("--data is required")
    torch.set_num_threads(args.threads)
    size = "smallest" if args.smallest else "quick" if args.quick else "full"
    grid = {"full": FULL, "quick": QUICK, "smallest": SMALLEST}[size]
    grid = replace(grid, records=args.records or grid.records)
    config = LookaheadConfig(prefix_cache_mb=0)  # the same prompts recur across points
    if args.quick and not args.model:
        engine = tiny_engine(config)
    else:
        engine = LookaheadEngine.from_pretrained(args.model, config=config)
    texts = Texts(engine, args.data, prompt_records=4 if args.smallest else 16)
    report: dict[str, Any] = {
        **run_header(engine, grid.records, grid.base.answer),
        "data": [p.name for p in args.data],
    }
    prompts = [texts.prompt(engine, n, grid.base.context) for n in range(4)]
    answers = [held[: grid.base.answer] for held in texts.held]
    report["trie_alone"] = trie_alone(texts, TRIE_SIZES[size], prompts, answers)
    report["crowded"] = crowded(texts, 8, {"full": 5000, "quick": 500, "smallest": 50}[size])
    if not args.trie_only:
        if engine.config.mode == "auto":
            engine.measure_costs()
        hf_generate(engine, prompts[0][-32:], 4)  # first-call costs are not timed
        engine.complete(prompts[0][-32:], max_new_tokens=4)
        kv_token = kv_bytes_per_token(engine)
        report["kv_bytes_per_token"] = kv_token
        report["points"] = []
        for axis, point in grid.points():
            row = {"axis": axis, **run_point(engine, texts, point, grid, kv_token)}
            print(json.dumps(row), flush=True)
            report["points"].append(row)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print_tables(report)


if __name__ == "__main__":
    main()
