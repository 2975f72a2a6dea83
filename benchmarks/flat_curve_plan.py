"""What `auto` forwards under a given cost curve: per step, the tree the drafter offered and the
part the plan kept, and whether the Jacobi window rode along.

Runs the engine in `auto` with the curve injected (``--curve-from``: the relative curve a bench
JSON recorded, e.g. the GPU's, which is nearly flat; never calibrated) next to `trie`, which
forwards every node the drafter offers, and counts the steps, as the engine's step observer
tells them (`rag_lookahead.engine.observe`: each row's proposed draft and the part forwarded).
Where the curve is flat, `auto` should keep every offered node and run the window on every step;
the steps that verify no tree are the steps on which the drafter matched nothing. (The
committed runs also forced the window on every step, ``auto+window``: that set the planner's
private threshold, which no public setting reaches.)

    python benchmarks/flat_curve_plan.py --data dolly_context_qa.jsonl \
        --curve-from benchmarks/cuda/cuda-smollm2-dolly_context_qa.json \
        --json benchmarks/cuda/flat-curve-plan-dolly.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from rag_lookahead import LookaheadEngine
from rag_lookahead.bench.run import gold_inputs, load_records
from rag_lookahead.decoding.tree import StepDraft
from rag_lookahead.engine.observe import Iteration, StepObserver, observe_steps
from rag_lookahead.planning.costs import CostCurve

# (name, mode): the plan, and the trie alone.
VARIANTS = (("auto", "auto"), ("trie", "trie"))


@dataclass
class Tally:
    """Steps planned, by what was offered and what was kept."""

    steps: int = 0
    offered_tree: int = 0  # steps whose drafter offered nodes beyond the root
    kept_whole_tree: int = 0  # of them, steps that forwarded every offered node
    offered_nodes: int = 0
    kept_nodes: int = 0
    offered_window: int = 0  # steps with a Jacobi window offered
    kept_window: int = 0
    root_only: int = 0  # steps forwarding the root alone: no tree, no window
    priced: float = 0.0  # the steps' forwards priced by the curve, in one-token forwards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--curve-from", type=Path, required=True, help="a bench JSON with a cost_curve")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    relative = json.loads(args.curve_from.read_text())["cost_curve"]
    curve = CostCurve(tuple(int(k) for k in relative), tuple(float(v) for v in relative.values()))
    engine = LookaheadEngine.from_pretrained(args.model)
    inputs = gold_inputs(engine, load_records(args.data, args.limit))
    results = {}
    for name, mode in VARIANTS:
        config = replace(engine.config, mode=mode)
        tally = Tally()
        run = LookaheadEngine(engine.model, engine.tokenizer, config, cost_curve=curve)
        with observe_steps(Watch(tally, curve)):
            tokens = [
                run.complete(i.prompt_ids, max_new_tokens=args.max_new_tokens).token_ids for i in inputs
            ]
        new_tokens = sum(map(len, tokens)) - len(tokens)  # after each prefill's token
        results[name] = {**vars(tally), "new_tokens": new_tokens, "answers": tokens}
    first = results[VARIANTS[0][0]]["answers"]
    same = min(sum(a == b for a, b in zip(first, r["answers"], strict=True)) for r in results.values())
    print(
        f"{'':<13} {'steps':>6} {'tree offered':>13} {'kept whole':>11} {'nodes kept':>11} {'window':>9} "
        f"{'root only':>10} {'priced/token':>13}"
    )
    for name, r in results.items():
        nodes = f"{r['kept_nodes']}/{r['offered_nodes']}"
        window = f"{r['kept_window']}/{r['offered_window']}"
        print(
            f"{name:<13} {r['steps']:>6} {r['offered_tree']:>13} {r['kept_whole_tree']:>11} {nodes:>11} "
            f"{window:>9} {r['root_only']:>10} {r['priced'] / r['new_tokens']:>13.3f}"
        )
    print(f"answers the same in every variant: {same}/{len(inputs)}")
    if args.json:
        for r in results.values():
            del r["answers"]
        record: dict[str, Any] = {
            "model": args.model or "SmolLM2-135M-Instruct",
            "data": args.data.name,
            "records": len(inputs),
            "cost_curve": relative,
            "curve_from": args.curve_from.name,
            "modes": results,
            "same_answers": same,
        }
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


class Watch(StepObserver):
    """Counts what each step's plan was offered and kept (a row's proposed draft, and the part
    of it forwarded)."""

    def __init__(self, tally: Tally, curve: CostCurve) -> None:
        self.tally, self.curve = tally, curve

    def iteration(self, record: Iteration) -> None:
        for step in record.steps:
            for row in step.rows:
                if row.proposed is not None:
                    self.count(row.proposed, row.forwarded)

    def count(self, offered: StepDraft, planned: StepDraft) -> None:
        t = self.tally
        t.steps += 1
        nodes, kept = len(offered.tree) - 1, len(planned.tree) - 1
        t.offered_tree += nodes > 0
        t.kept_whole_tree += nodes > 0 and kept == nodes
        t.offered_nodes += nodes
        t.kept_nodes += kept
        t.offered_window += offered.side is not None
        t.kept_window += planned.side is not None
        t.root_only += kept == 0 and planned.side is None
        forwarded = len(planned.tree) + (len(planned.side) if planned.side is not None else 0)
        t.priced += self.curve(forwarded) / self.curve(1)


if __name__ == "__main__":
    main()
