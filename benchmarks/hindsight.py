"""Hindsight bounds for drafts copied from text: how fast could *any* lookup drafter decode?

The replay's ``oracle`` bounds planners over the drafts a drafter proposed. This bounds the
drafters themselves. At every step it knows the rest of the recorded greedy answer and drafts
the longest run of it (at most ``--depth`` tokens, the engine's ``decoding_length``) that can be
copied out of the texts a drafter may look up, right after an earlier occurrence of the
context's last ``m`` tokens (``--min-match``): ``m = 1`` is what a suffix or trie drafter
reaches with a perfect choice among all its matches (one chain), ``m = 2`` the same for one
that drafts only on matches of two tokens or more, ``m = 0`` a run standing anywhere (a loose
ceiling: every common token stands somewhere). The texts are the call's own (its prompt and
the answer so far), then also the earlier records' answers (what the shared trie keeps of a
server's outputs). Each step verifies the run and the root at the cost curve's price for that
size (verifying the whole known run is optimal when the curve is subadditive: two smaller
forwards never cost less than one larger, as on every measured curve here); greedy
verification accepts it and the model's own next token.

    python benchmarks/replay.py record --data llma_msmarco_rag.jsonl --limit 20 \
        --threads 1 --out llma.json
    python benchmarks/hindsight.py llma.json --curve ~/.cache/rag-lookahead/costs/costs-*.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replay import load_curve

from rag_lookahead.planning.costs import CostCurve

__all__ = ["bound", "longest_copy"]


def longest_copy(texts: Sequence[Sequence[int]], tail: Sequence[int], run: Sequence[int]) -> int:
    """Length of the longest prefix of ``run`` found in one of ``texts`` right after an
    occurrence of ``tail`` (anywhere when ``tail`` is empty)."""
    best, m = 0, len(tail)
    for text in texts:
        for start in range(m, len(text)):
            if m and (text[start - 1] != tail[-1] or text[start - m : start] != tail):
                continue
            length = 0
            while length < len(run) and start + length < len(text) and text[start + length] == run[length]:
                length += 1
            best = max(best, length)
            if best == len(run):
                return best
    return best


def bound(
    recorded: dict[str, Any], curve: CostCurve, depth: int, min_match: int, past: bool
) -> dict[str, float]:
    """Decode speedup over one-token steps and tokens per forward of the hindsight drafter."""
    cost = greedy_cost = 0.0
    steps = tokens = 0
    earlier: list[list[int]] = []
    for item in recorded["answers"]:
        prompt, answer = item["prompt"], item["output"]
        done = 1  # the first token comes from the prefill
        while done < len(answer):
            # The answer's last token can only be the model's own, never a matched draft.
            run = answer[done : min(len(answer) - 1, done + depth)]
            own = prompt + answer[:done]
            tail = own[len(own) - min_match :] if min_match else []
            copied = longest_copy([own, *(earlier if past else [])], tail, run)
            cost += curve(copied + 1)
            done += copied + 1
            steps += 1
        greedy_cost += (len(answer) - 1) * curve(1)
        tokens += len(answer) - 1
        earlier.append(answer)
    return {"decode_speedup": round(greedy_cost / cost, 3), "tokens_per_forward": round(tokens / steps, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recorded", nargs="+", type=Path, help="answers from `replay record`")
    parser.add_argument("--curve", required=True, type=Path, help="a cost-curve JSON from the cache")
    parser.add_argument("--depth", type=int, default=16, help="most draft tokens a step")
    parser.add_argument(
        "--min-match", default="1,2,0", help="context tokens a copy must follow, comma-separated"
    )
    args = parser.parse_args()
    curve = load_curve(args.curve)
    for path in args.recorded:
        recorded = json.loads(path.read_text())
        for min_match in (int(m) for m in args.min_match.split(",")):
            for past in (False, True):
                name = f"min_match={min_match}" + (" +past answers" if past else "")
                print(path.stem, name, bound(recorded, curve, args.depth, min_match, past))


if __name__ == "__main__":
    main()
