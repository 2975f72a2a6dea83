"""A chart of a benchmark summary: tokens/s and tokens per forward, per method."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_summary"]


def plot_summary(summary: dict[str, Any], path: str | Path) -> None:
    """Write a PNG with two bar charts of ``summary`` (the `run_benchmark` result)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ValueError("--plot needs matplotlib: pip install 'rag-lookahead[plot]'") from err
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
