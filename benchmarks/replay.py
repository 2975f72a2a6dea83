"""Replay: drafting policies priced on recorded greedy answers, without running the model.

Greedy verification accepts exactly the longest draft path that matches the greedy answer, so
once the answers are recorded, the drafters and the planner can be replayed on them and each
step priced with a forward-cost curve. Measured runs on SmolLM2 land within ~3% of the replay
(host work per step is not priced). ``oracle`` drafts the full tree exactly when something of
it will be accepted: a ceiling for any planner over the same drafts.

    python benchmarks/replay.py record --data llma_msmarco_rag.jsonl --limit 40 --out llma.json
    python benchmarks/replay.py replay llma.json --curve ~/.cache/rag-lookahead/costs/costs-*.json
    python benchmarks/replay.py batch llma.json --grid benchmarks/step-grid-cpu-2026-12-02.json

``batch`` prices many clients at once against the serialised engine (`batch_replay`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from batch_replay import (
    BATCH_POLICIES,
    GRID_SHAPES,
    batch_bounds,
    load_grid,
    matched,
    reshaped,
)

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.bench.run import gold_inputs, load_records
from rag_lookahead.config import Mode
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting.compose import build_drafter
from rag_lookahead.drafting.protocol import Drafter
from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.planning.costs import CostCurve, CostModel
from rag_lookahead.planning.planner import StepPlanner

__all__ = ["PromptLookup", "load_curve", "matched", "record", "replay"]

Plan = Callable[[DraftTree, list[int]], DraftTree]  # (proposed tree, the answer from here) -> verified tree


def record(data: Path, limit: int, max_new_tokens: int, out: Path, model: str | None = None) -> None:
    """Greedy answers of the first ``limit`` records, with their prompts, as JSON."""
    engine = LookaheadEngine.from_pretrained(model, config=LookaheadConfig(mode="off"))
    answers = [
        {
            "prompt": item.prompt_ids,
            "output": engine.complete(item.prompt_ids, max_new_tokens=max_new_tokens).token_ids,
        }
        for item in gold_inputs(engine, load_records(data, limit))
    ]
    out.write_text(json.dumps({"max_new_tokens": max_new_tokens, "answers": answers}))


class PromptLookup:
    """HF prompt lookup's drafts (``prompt_lookup_num_tokens=10``, n-grams of up to 2 tokens):
    the continuation of the first earlier occurrence of the context's last n-gram."""

    def __init__(self, tokens: int = 10, ngram: int = 2) -> None:
        self.tokens, self.ngram = tokens, ngram

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        context = list(context)
        for size in range(min(self.ngram, len(context) - 1), 0, -1):
            tail = context[-size:]
            for start in range(len(context) - size):
                if context[start : start + size] == tail:
                    chain = context[start + size : start + size + min(self.tokens, budget)]
                    parents = list(range(-1, len(chain) - 1))
                    return StepDraft(DraftTree.from_draft(context[-1], chain, parents, "lookup"))
        return StepDraft(DraftTree.root_only(context[-1]))

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        pass

    def close(self) -> None:
        pass


def replay(
    recorded: dict[str, Any], config: LookaheadConfig, curve: CostCurve, policy: str
) -> dict[str, float]:
    """Decode-phase speedup over greedy and tokens per forward for ``policy`` (auto, trie,
    oracle; path: only the part of the draft the model accepts, a ceiling for any plan over
    these drafts; or prompt_lookup: HF prompt lookup's drafts, each verified whole)."""
    trie = TokenTrie(config.max_query_length, config.branch_length, config.max_trie_nodes)
    planner = StepPlanner(config, CostModel(curve))
    plans: dict[str, Plan] = {
        "auto": lambda tree, answer: planner.plan(StepDraft(tree), room=1 << 62).tree,
        "trie": lambda tree, answer: tree,
        "prompt_lookup": lambda tree, answer: tree,
        "oracle": lambda tree, answer: tree if len(matched(tree, answer)) > 1 else tree.subtree([]),
        "path": lambda tree, answer: tree.subtree(matched(tree, answer)[1:]),
    }
    plan = plans[policy]
    cost = greedy_cost = 0.0
    steps = tokens = 0
    for item in recorded["answers"]:
        prompt, answer = item["prompt"], item["output"]
        drafter: Drafter = (
            PromptLookup() if policy == "prompt_lookup" else build_drafter(config, trie, [prompt])
        )
        context, done = prompt + answer[:1], 1  # the first token comes from the prefill
        drafter.observe(answer[:1])
        while done < len(answer):
            budget = min(config.decoding_length, recorded["max_new_tokens"] - done - 1)
            tree = DraftTree.root_only(context[-1])
            if budget > 0:
                tree = plan(drafter.propose(context, budget).tree, answer[done:])
            nodes = matched(tree, answer[done:])
            planner.learn(tree, nodes)
            emitted = answer[done : done + len(nodes)]
            drafter.observe(emitted)
            context += emitted
            done += len(emitted)
            cost += curve(len(tree))
            steps += 1
        drafter.close()
        greedy_cost += (len(answer) - 1) * curve(1)
        tokens += len(answer) - 1
    return {"decode_speedup": round(greedy_cost / cost, 3), "tokens_per_forward": round(tokens / steps, 3)}


def load_curve(path: Path) -> CostCurve:
    data = json.loads(path.read_text())
    return CostCurve(tuple(data["sizes"]), tuple(data["seconds"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="record greedy answers")
    rec.add_argument("--data", required=True, type=Path)
    rec.add_argument("--limit", type=int, default=20)
    rec.add_argument("--max-new-tokens", type=int, default=128)
    rec.add_argument("--out", required=True, type=Path)
    rec.add_argument("--threads", type=int, default=2, help="torch threads of the recording run")
    rec.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    rep = commands.add_parser("replay", help="price policies on recorded answers")
    rep.add_argument("recorded", nargs="+", type=Path)
    rep.add_argument("--curve", required=True, type=Path, help="a cost-curve JSON from the cache")
    rep.add_argument("--policies", default="auto,trie,oracle")
    rep.add_argument("--draft-policy", default=LookaheadConfig.draft_policy, choices=("trie", "suffix"))
    bat = commands.add_parser("batch", help="price many clients at once against the serialised engine")
    bat.add_argument("recorded", nargs="+", type=Path)
    bat.add_argument("--grid", required=True, type=Path, help="a grid from benchmarks/step_costs.py --json")
    bat.add_argument("--clients", type=int, default=8)
    bat.add_argument("--policies", default=",".join(BATCH_POLICIES))
    bat.add_argument(
        "--shape", default="measured", choices=GRID_SHAPES, help="the grid, or a shape made from it"
    )
    bat.add_argument("--draft-policy", default=LookaheadConfig.draft_policy, choices=("trie", "suffix"))
    bat.add_argument(
        "--join-chunk", type=int, help="prefill joining prompts in chunks of this many tokens between steps"
    )
    args = parser.parse_args()
    if args.command == "batch":
        _batch(args)
        return
    if args.command == "record":
        torch.set_num_threads(args.threads)
        record(args.data, args.limit, args.max_new_tokens, args.out, args.model)
        return
    curve = load_curve(args.curve)
    for path in args.recorded:
        recorded = json.loads(path.read_text())
        for policy in args.policies.split(","):
            mode: Mode = "trie" if policy == "trie" else "auto"
            config = LookaheadConfig(mode=mode, draft_policy=args.draft_policy)
            print(path.stem, policy, replay(recorded, config, curve, policy))


def _batch(args: argparse.Namespace) -> None:
    grid = reshaped(load_grid(args.grid), args.shape)
    config = LookaheadConfig(mode="auto", draft_policy=args.draft_policy)
    for path in args.recorded:
        recorded = json.loads(path.read_text())
        policies = args.policies.split(",")
        bounds = batch_bounds(recorded, config, grid, args.clients, policies, args.join_chunk)
        for name, figures in bounds.items():
            print(path.stem, name, figures)


if __name__ == "__main__":
    main()
