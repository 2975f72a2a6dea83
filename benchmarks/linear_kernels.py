"""torch's BLAS against oneDNN (over the weights as they are, and reordered: ``reordered``) for the
engine's CPU forwards (`cpu_linear`), timed in turn.

Two parts, each kernel alternated with the others in one process, the median of the repeats:

- ``linear``: one fp32 linear layer of the default model's shapes (an MLP projection and the
  vocabulary head) for 1 to 32 rows, the rows a decoding step gives it;
- ``forward``: the engine's runner over one row's chain of 1 to 17 draft tokens and over 8 rows,
  after ``--context`` cached tokens, with the largest logit difference from torch's kernel and
  whether every position's greedy token agrees with it.

    python benchmarks/linear_kernels.py --threads 2
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch

from rag_lookahead import LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.kernels import OneDnnLayers
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.tuning import ModelTuning


def _alternated(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median milliseconds of each run, the runs alternated ``repeats`` times (2 warm-ups)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats + 2):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t[2:]) for name, t in times.items()}


KERNELS = ("torch", "onednn", "reordered")


def _linear_runs(x: torch.Tensor, weight: torch.Tensor) -> dict[str, Callable[[], object]]:
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    layers = OneDnnLayers(layer)
    layers.reorder()

    def run(kernel: str) -> object:
        with torch.inference_mode():
            if kernel == "torch":
                return layer(x)
            with layers.installed(reordered=kernel == "reordered"):
                return layer(x)

    return {kernel: functools.partial(run, kernel) for kernel in KERNELS}


def linear_table(hidden: int, shapes: dict[str, int], rows: list[int], repeats: int) -> None:
    print(f"{'layer':<10}{'rows':>5}" + "".join(f"{kernel + ' ms':>11}" for kernel in KERNELS) + "  vs torch")
    for name, out in shapes.items():
        weight = torch.randn(out, hidden)
        for n in rows:
            ms = _alternated(_linear_runs(torch.randn(1, n, hidden), weight), repeats)  # x [1, T, D]
            ratios = " ".join(f"{ms['torch'] / ms[kernel]:.2f}x" for kernel in KERNELS[1:])
            print(f"{name:<10}{n:>5}" + "".join(f"{ms[kernel]:>11.3f}" for kernel in KERNELS) + f"  {ratios}")


def _step_runs(
    runners: dict[str, ModelRunner], batch: BatchCache, chain: StepDraft, context: int
) -> tuple[dict[str, Callable[[], object]], dict[str, torch.Tensor]]:
    """One step of ``chain`` on every row of ``batch`` by each runner, and where its logits go."""
    logits: dict[str, torch.Tensor] = {}
    rows, width = batch.rows, len(chain)

    def step(kernel: str) -> None:
        runner = runners[kernel]
        if rows == 1:  # one row: the call-alone forward, its new entries cropped
            logits[kernel] = runner.forward_step(chain, batch.cache, context)[0]  # [T, V]
            batch.cache.crop(-width)
            return
        batch.prepare()
        inputs = batch_inputs([chain] * rows, batch.lengths, runner.device, torch.float32)
        logits[kernel] = runner.forward_batch(inputs, batch.cache, batch.lengths)  # [B, T, V]

    return {kernel: functools.partial(step, kernel) for kernel in runners}, logits


def forward_table(engine: LookaheadEngine, context: int, rows: int, widths: list[int], repeats: int) -> None:
    runners = {kernel: ModelTuning(engine.model, kernel).runner for kernel in KERNELS}  # type: ignore[arg-type]
    vocab = min(1000, engine.vocab_size - 5)  # (a tiny model's is smaller)
    prompt = [(31 * i + 7) % vocab + 5 for i in range(context)]
    print(
        f"{'rows':>4}{'width':>6}"
        + "".join(f"{kernel + ' ms':>11}" for kernel in KERNELS)
        + "  vs torch     max |diff|  argmax"
    )
    for n in (1, rows):
        batch = BatchCache()
        for _ in range(n):
            _, cache = runners["torch"].forward(torch.tensor([prompt]), new_tree_cache(), last_only=True)
            batch.add_row(cache)
        for width in widths:
            chain = StepDraft(DraftTree(tuple(prompt[:width]), tuple(range(-1, width - 1))))
            runs, logits = _step_runs(runners, batch, chain, context)
            ms = _alternated(runs, repeats)
            diff = max((logits["torch"] - logits[kernel]).abs().max().item() for kernel in KERNELS[1:])
            same = all(bool((logits["torch"].argmax(-1) == logits[k].argmax(-1)).all()) for k in KERNELS[1:])
            ratios = " ".join(f"{ms['torch'] / ms[kernel]:.2f}x" for kernel in KERNELS[1:])
            print(
                f"{n:>4}{width:>6}"
                + "".join(f"{ms[kernel]:>11.1f}" for kernel in KERNELS)
                + f"  {ratios}{diff:>11.1e}{'equal' if same else 'DIFFER':>8}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--context", type=int, default=300, help="cached tokens per row")
    parser.add_argument("--rows", type=int, default=8, help="rows of the batched forwards")
    parser.add_argument("--widths", default="1,2,3,4,8,12,16,17")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = LookaheadEngine.from_pretrained(args.model)
    config = engine.model.config
    shapes = {"mlp": int(config.intermediate_size), "head": int(config.vocab_size)}
    widths = [int(w) for w in args.widths.split(",")]
    linear_table(int(config.hidden_size), shapes, sorted({*widths, 32}), args.repeats)
    print()
    forward_table(engine, args.context, args.rows, widths, args.repeats)


if __name__ == "__main__":
    main()
