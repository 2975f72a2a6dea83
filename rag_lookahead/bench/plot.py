"""A chart of a benchmark summary: tokens/s and tokens per forward, per method."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_concurrency", "plot_fresh", "plot_sets", "plot_summary"]


def plot_summary(summary: dict[str, Any], path: str | Path) -> None:
    """Write a PNG with two bar charts of ``summary`` (the `run_benchmark` result)."""
    plt = _pyplot()
    methods = list(summary["methods"])
    speed = [summary["methods"][m]["tokens_per_s"] for m in methods]
    per_step = [summary["methods"][m]["mean_accepted_per_step"] or 1.0 for m in methods]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(methods, speed, color="#4c72b0")
    left.set_title("tokens per second")
    for i, m in enumerate(methods):
        left.annotate(
            f"{summary['methods'][m]['speedup_vs_greedy']:.2f}x", (i, speed[i]), ha="center", va="bottom"
        )
    right.bar(methods, per_step, color="#55a868")
    right.set_title("tokens per forward (accepted + 1)")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=20)
    name = summary.get("data", "")
    fig.suptitle(
        f"{summary['model']} on {name}: {summary['records']} records, {summary['max_new_tokens']} new tokens"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sets(summaries: dict[str, dict[str, Any]], methods: list[str], model: str, path: str | Path) -> None:
    """A PNG of one benchmark run per data set (``summaries``: set name -> `run_benchmark`
    result): each method's end-to-end speedup over greedy and its tokens per forward, side by
    side; ``model`` names the model in the title."""
    plt = _pyplot()
    names = list(summaries)
    fig, (speed, per_step) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        label = "lookahead (auto)" if method == "lookahead" else method
        xs = [x + i * width for x in range(len(names))]
        rows = [summaries[name]["methods"][method] for name in names]
        speed.bar(xs, [r["speedup_vs_greedy"] for r in rows], width, label=label)
        per_step.bar(xs, [r["mean_accepted_per_step"] or 0 for r in rows], width, label=label)
    middle = width * (len(methods) - 1) / 2
    for axis, title in ((speed, "speedup over greedy (end to end)"), (per_step, "tokens per forward")):
        axis.set_xticks([x + middle for x in range(len(names))], [name.split("_")[0] for name in names])
        axis.set_title(title)
        axis.legend(fontsize=8)
    speed.axhline(1.0, color="gray", lw=0.8)
    first = summaries[names[0]]
    fig.suptitle(
        f"{model} {first['dtype']}, {first['threads']} CPU threads, "
        f"{first['max_new_tokens']} new tokens, {first['records']} records per set; "
        "outputs identical to greedy"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_concurrency(summary: dict[str, Any], path: str | Path) -> None:
    """A PNG of a concurrency summary: throughput and p95 latency per method and level."""
    plt = _pyplot()
    levels = list(summary["concurrency"])
    methods = list(summary["concurrency"][levels[0]]["methods"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(methods)
    for m, name in enumerate(methods):
        xs = [i + m * width for i in range(len(levels))]
        rows = [summary["concurrency"][level]["methods"].get(name, {}) for level in levels]
        left.bar(xs, [r.get("decode_tokens_per_s", 0) for r in rows], width, label=name)
        right.bar(xs, [r.get("p95_latency_s", 0) for r in rows], width, label=name)
    for axis, title in ((left, "decode tokens per second (all clients)"), (right, "p95 latency (s)")):
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(levels))], [f"{n} clients" for n in levels])
        axis.set_title(title)
    left.legend(fontsize=8)
    fig.suptitle(f"{summary['model']} on {summary.get('data', '')}: {summary['records']} questions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fresh(summary: dict[str, Any], path: str | Path) -> None:
    """A PNG of a fresh-questions summary: lookahead against plain, per answer."""
    plt = _pyplot()
    ratios = [a["ratio"] for a in summary["answers"]]
    fig, ax = plt.subplots(figsize=(max(6, len(ratios) * 0.35), 3.5))
    ax.bar(range(1, len(ratios) + 1), ratios, color=["#55a868" if r >= 1 else "#c44e52" for r in ratios])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(summary["aggregate_ratio"], color="#4c72b0", linestyle="--", linewidth=1)
    ax.set_xlabel("question")
    ax.set_ylabel("plain time / lookahead time")
    ax.set_title(
        f"{summary.get('data', '')}: {summary['records']} fresh questions, "
        f"{summary['max_new_tokens']} tokens\n"
        f"all answers {summary['aggregate_ratio']:.2f}x (dashed); cost curve {summary['cost_curve']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ValueError("--plot needs matplotlib: pip install 'rag-lookahead[plot]'") from err
    return plt
