"""Redraw benchmarks/cpu-smollm2.png and print the README table from the JSON files here.

python benchmarks/chart.py      (after `rag-lookahead bench ... --json benchmarks/SET.json`)
"""

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent
SETS = ["llma_msmarco_rag", "piarena_rag_qa", "dolly_context_qa", "squad_v2_dev_subset"]
METHODS = {"prompt_lookup": "#4c72b0", "trie": "#dd8452", "lookahead": "#55a868"}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    data = {s: json.loads((HERE / f"{s}.json").read_text()) for s in SETS}
    fig, (speed, per_step) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.25
    for i, (method, color) in enumerate(METHODS.items()):
        label = "lookahead (auto)" if method == "lookahead" else method
        xs = [x + i * width for x in range(len(SETS))]
        speed.bar(
            xs,
            [data[s]["methods"][method]["speedup_vs_greedy"] for s in SETS],
            width,
            label=label,
            color=color,
        )
        steps = [data[s]["methods"][method]["mean_accepted_per_step"] or 0 for s in SETS]
        per_step.bar(xs, steps, width, label=label, color=color)
    for axis, title in ((speed, "speedup over greedy (end to end)"), (per_step, "tokens per forward")):
        axis.set_xticks([x + width for x in range(len(SETS))], [s.split("_")[0] for s in SETS])
        axis.set_title(title)
        axis.legend(fontsize=8)
    speed.axhline(1.0, color="gray", lw=0.8)
    first = data[SETS[0]]
    fig.suptitle(
        f"SmolLM2-135M {first['dtype']}, {first['threads']} CPU threads, "
        f"{first['max_new_tokens']} new tokens, "
        f"{first['records']} records per set; outputs identical to greedy"
    )
    fig.tight_layout()
    fig.savefig(HERE / "cpu-smollm2.png", dpi=100)
    for s in SETS:
        m = data[s]["methods"]
        g, p, t, la = m["greedy"], m["prompt_lookup"], m["trie"], m["lookahead"]
        print(
            f"| `{s}.jsonl` | {g['tokens_per_s']:.1f} | {p['speedup_vs_greedy']:.2f}x "
            f"| {t['speedup_vs_greedy']:.2f}x "
            f"| **{la['speedup_vs_greedy']:.2f}x** | {la['speedup_vs_prompt_lookup']:.2f}x "
            f"| {la['decode_speedup_vs_greedy']:.2f}x | {la['mean_accepted_per_step']:.2f} "
            f"| {la['identical_to_greedy']}/{data[s]['records']} |"
        )


if __name__ == "__main__":
    main()
