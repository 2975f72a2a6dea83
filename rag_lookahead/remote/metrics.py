"""vLLM's speculative-decoding counters, read from its Prometheus ``/metrics`` page.

They are server-wide: the difference of two readings covers every request the server finished
in between, which is one call's only when nothing else ran meanwhile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SpeculationCounters", "parse_speculation_counters"]

_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
}


@dataclass(frozen=True)
class SpeculationCounters:
    """Verification steps that carried a draft, draft tokens verified, draft tokens accepted."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def __sub__(self, earlier: SpeculationCounters) -> SpeculationCounters:
        return SpeculationCounters(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted_tokens - earlier.accepted_tokens,
        )

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens per drafted verification step, the model's own token included."""
        return 1 + self.accepted_tokens / self.drafts if self.drafts else 1.0


def parse_speculation_counters(text: str) -> SpeculationCounters:
    """The counters in a Prometheus text page, summed over their label sets (engines, models).

    Three counters in the plain text format need no exposition parser: a sample line is
    ``name{labels} value``, comments start with ``#``.
    """
    totals = dict.fromkeys(_COUNTERS.values(), 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        field = _COUNTERS.get(name)
        if field is None:
            continue
        try:
            rest = line.rsplit("}", 1)[1] if "{" in line else line[len(name) :]
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value):
            totals[field] += value
    return SpeculationCounters(**{k: int(v) for k, v in totals.items()})
