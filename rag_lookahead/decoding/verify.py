"""Tree verification as pure functions: choose the model's token at every node, then walk.

Losslessness does not depend on the draft. At every node the model's own token is chosen from
its own (processed) distribution given the node's exact prefix: the argmax for greedy, an
independent sample for sampling. The walk then follows, from the root, the child that carries
the chosen token. Every emitted token is therefore exactly what plain decoding would have emitted
(greedy) or a draw from the same conditional distribution (sampling); the draft only decides how
many of them one forward pass yields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rag_lookahead.config import GenerationParams
from rag_lookahead.decoding.argmax import first_argmax
from rag_lookahead.decoding.tree import DraftTree

__all__ = [
    "Accepted",
    "TokenChooser",
    "accept",
    "node_prefixes",
    "position_uniform",
    "raw_logprobs",
    "sample_inverse_cdf",
]


@dataclass(frozen=True)
class Accepted:
    """The outcome of one step: tokens to emit and the tree nodes whose KV entries stay."""

    tokens: list[int]  # matched draft tokens, then the model's own next token
    nodes: list[int]  # root first; len(nodes) == len(tokens)


def accept(tree: DraftTree, chosen: Sequence[int]) -> Accepted:
    """Walk from the root while the model's chosen token is a child in the draft."""
    node, nodes, tokens = 0, [0], [chosen[0]]
    while (child := tree.child(node, tokens[-1])) is not None:
        node = child
        nodes.append(node)
        tokens.append(chosen[node])
    return Accepted(tokens, nodes)


def node_prefixes(context: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """``[n, L + depth]`` token ids each node is conditioned on: context, then its draft path.

    Rows are padded with the root token, which is already in the context, so prefix-set
    processors such as the repetition penalty see exactly each node's own prefix.
    """
    depth = max(tree.depths)
    rows = torch.full((len(tree), depth), tree.tokens[0], dtype=torch.long)
    for node in range(1, len(tree)):
        path = [tree.tokens[i] for i in tree.path(node)[1:]]
        rows[node, : len(path)] = torch.tensor(path)
    return torch.cat([context.expand(len(tree), -1), rows], dim=1)


class TokenChooser:
    """Picks the model's token at each tree node, the way `model.generate` processes logits.

    Sampling draws the token at sequence position ``p`` by inverting the node's cumulative
    distribution at a uniform number keyed by the call's seed and ``p`` alone. Nodes at the same
    depth share that number, and only one of them lies on the accepted path; so each emitted
    token is an independent draw from its own distribution, and a seeded call emits the same
    tokens whatever was drafted — the same as with lookahead off. Without a seed, the call's key
    comes from torch's global generator (so ``torch.manual_seed`` makes runs repeat).

    The processors run in `generate`'s order: ``logit_bias`` first (as its ``sequence_bias``
    of single tokens), then the repetition penalty, then the sampling warpers. Each node's
    scores get them all, so a biased call with lookahead emits what it would emit without.
    """

    def __init__(self, params: GenerationParams) -> None:
        self.do_sample = params.sampling
        steps: list = []
        if params.logit_bias:
            steps.append(SequenceBiasLogitsProcessor([[[token], bias] for token, bias in params.logit_bias]))
        if params.repetition_penalty != 1.0:
            steps.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
        if self.do_sample:
            if params.temperature != 1.0:
                steps.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k is not None:
                steps.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                steps.append(TopPLogitsWarper(params.top_p))
        self.processors = LogitsProcessorList(steps)
        self.needs_prefix = params.repetition_penalty != 1.0
        seed = params.seed
        if self.do_sample and seed is None:
            seed = int(torch.randint(0, 1 << 62, (1,)).item())
        self.key = _mix(seed if seed is not None else 0)

    def choose(
        self,
        logits: torch.Tensor,
        context: Sequence[int],
        tree: DraftTree,
        allowed: torch.Tensor | None = None,
    ) -> list[int]:
        """One token per node from ``logits`` [n, V], given the ``context`` ids before it.

        ``allowed`` [n, V'] (a grammar's tokens at each node) restricts each node's choice
        before any other processing, as a constrained `generate` would; ids beyond V' are
        not allowed.
        """
        scores = logits.float()  # like `generate`, process in fp32 whatever the model dtype
        if allowed is not None:
            scores = scores.masked_fill(~_fit(allowed, scores.shape[-1]).to(scores.device), float("-inf"))
        if self.processors:
            if self.needs_prefix:
                prefixes = node_prefixes(torch.tensor([context], dtype=torch.long), tree)
            else:  # the warpers look at scores only
                prefixes = torch.zeros(len(tree), 1, dtype=torch.long)
            scores = self.processors(prefixes.to(scores.device), scores)  # type: ignore[arg-type]
        if not self.do_sample:
            return first_argmax(scores).tolist()
        first = len(context)  # the root's next token sits at this position
        uniforms = [position_uniform(self.key, first + depth) for depth in tree.depths]
        return sample_inverse_cdf(torch.softmax(scores, dim=-1), uniforms)


def _fit(allowed: torch.Tensor, vocab: int) -> torch.Tensor:
    """``allowed`` [n, V'] as [n, vocab] on its device: cut, or padded with refusals."""
    if allowed.shape[-1] >= vocab:
        return allowed[:, :vocab]
    return torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[-1]), value=False)


_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    """SplitMix64's finaliser: a well-spread 64-bit hash of ``value``."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def position_uniform(key: int, position: int) -> float:
    """A uniform number in [0, 1) that depends on ``key`` and ``position`` only."""
    return (_mix(key ^ _mix(position)) >> 11) * 2.0**-53


def sample_inverse_cdf(probs: torch.Tensor, uniforms: Sequence[float]) -> list[int]:
    """For each row of ``probs`` [n, V], the token where its cumulative sum first exceeds
    ``uniforms[row]`` times the row's total; a zero-probability token is never chosen."""
    cdf = probs.double().cumsum(dim=-1)  # [n, V]; float64, so the tail keeps its resolution
    targets = torch.tensor(uniforms, dtype=torch.float64, device=probs.device).unsqueeze(1)  # [n, 1]
    chosen = torch.searchsorted(cdf, targets * cdf[:, -1:], right=True).squeeze(1)  # [n]
    # Rounding could put a target at the very end: fall back to the last possible token.
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)  # [n]
    return torch.minimum(chosen, last).tolist()


def raw_logprobs(
    logits: torch.Tensor, tokens: Sequence[int], k: int
) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """The raw log probability of ``tokens[i]`` under ``logits[i]`` ([a, V], the accepted rows
    only), and the ``k`` most likely (id, log probability) pairs of each row, best first.

    Raw: the model's own log-softmax in fp32, before any processing the choice went through
    (see `rag_lookahead.streaming.logprobs`).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # [a, V]
    ids = torch.tensor(list(tokens), dtype=torch.long, device=logp.device)  # [a]
    chosen = logp.gather(1, ids.unsqueeze(1)).squeeze(1).tolist()  # [a]
    if k == 0:
        return chosen, [[] for _ in chosen]
    values, indices = logp.topk(k, dim=-1)  # [a, k], best first
    return chosen, [
        list(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)
    ]
