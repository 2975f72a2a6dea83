"""Drafts from the call's own text, as deep as the match is long (SuffixDecoding, arXiv 2411.04975).

Every earlier occurrence of the context's last token in the call's prompt, documents and output
so far is a candidate; its *match length* is how many tokens before it agree with the context.
A candidate's continuation is drafted up to a depth that grows with its match length, and
candidates vote for their continuations with a weight that also grows with it, so a long copy
drafts a deep chain while a one-token coincidence drafts a few tokens with little weight. The draft keeps the
branches with the most weight, best first.

Each node's source names the longest match behind it in coarse buckets ("sfx1" ... "sfx16"),
so the planner learns how deep each kind of match is accepted on the model at hand.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from rag_lookahead.decoding.tree import PREDICTION_LABEL, DraftTree, StepDraft
from rag_lookahead.drafting.trie_nodes import as_tokens, check_int

__all__ = ["PREDICTION_LABEL", "SuffixDrafter", "SuffixRule", "match_bucket"]

_SEPARATOR = -1  # between texts: never a token id, so no match or continuation crosses it
_BUCKETS = (16, 8, 4, 3, 2, 1)  # lower bounds of the match-length buckets, longest first
_LABELS = ("sfx", PREDICTION_LABEL)  # by where a match is: the call's own text, or its prediction


def match_bucket(length: int) -> int:
    """The bucket a match of ``length`` tokens falls in (the largest bound at most it)."""
    return next(bound for bound in _BUCKETS if length >= bound)


@dataclass(frozen=True)
class SuffixRule:
    """How a match's length sets its branch: depth ``depth_factor * length + depth_offset``
    (at most ``max_depth``), weight ``length ** weight_power``; matches longer than
    ``max_match`` count as ``max_match``; only the ``max_candidates`` longest matches vote,
    and a node needs ``min_share`` of all the votes to be drafted. Only the latest
    ``max_scan`` occurrences of the last token are looked at, which bounds a step's work on
    repetitive text."""

    max_match: int = 32
    max_depth: int = 16
    depth_factor: float = 4.0
    depth_offset: int = 0
    weight_power: float = 2.0
    max_candidates: int = 32
    min_share: float = 0.05
    max_scan: int = 512

    def __post_init__(self) -> None:
        for name in ("max_match", "max_depth", "max_candidates", "max_scan"):
            check_int(name, getattr(self, name), 1)
        check_int("depth_offset", self.depth_offset, 0)
        for name in ("depth_factor", "weight_power"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
        if not 0 <= self.min_share <= 1:
            raise ValueError(f"min_share must be in [0, 1], got {self.min_share!r}")

    def depth(self, length: int) -> int:
        return min(self.max_depth, int(self.depth_factor * length) + self.depth_offset)

    def weight(self, length: int) -> float:
        return float(length) ** self.weight_power


class SuffixDrafter:
    """Drafts from the call's own token ids (prompt, documents, then what it emitted).

    Sees token ids only; holds nothing shared, so `close` just lets go of its text.

    A ``prediction`` (the text the answer is expected to copy) is one more text, preferred: of
    two matches as long, its own comes first, and the nodes it is the first voter of are
    labelled ``PREDICTION_LABEL`` instead of ``"sfx"`` (``"pred4"``), so that the planner learns its
    drafts apart and the call counts them.
    """

    def __init__(
        self,
        sequences: Sequence[Sequence[int]],
        min_match: int = 1,
        rule: SuffixRule | None = None,
        prediction: Sequence[int] = (),
    ) -> None:
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise ValueError(f"min_match must be a positive integer, got {min_match!r}")
        self.rule = rule if rule is not None else SuffixRule()
        self.min_match = min_match
        # A match's vote, depth and sources by its length (which the tail's slice keeps <= max_match)
        lengths = range(self.rule.max_match + 1)
        own, predicted = (["", *(f"{label}{match_bucket(n)}" for n in lengths[1:])] for label in _LABELS)
        self._tables = _Tables(
            [self.rule.weight(n) for n in lengths],
            [self.rule.depth(n) for n in lengths],
            own,
            predicted,
            self.rule.min_share,
        )
        self._text: list[int] = []
        self._where: dict[int, list[int]] = {}  # token -> its positions in _text
        # (token, next token) -> the next token's positions: its occurrences that match 2+ tokens
        self._pairs: dict[tuple[int, int], list[int]] = {}
        self._predicted = len(prediction)  # the prediction is _text[:_predicted], first
        for seq in [prediction] if prediction else []:
            self._append(as_tokens(seq))
            self._text.append(_SEPARATOR)
        for seq in sequences:
            self.add_text(seq)

    def add_text(self, tokens: Sequence[int], *, ends: bool = True) -> None:
        """Take one more text to draft from, or a part of it (``ends=False``: the text goes on
        at the next call): the same drafter as one given all its texts at once."""
        self._append(as_tokens(tokens))
        if ends:
            self._text.append(_SEPARATOR)

    def _append(self, tokens: list[int]) -> None:
        where, pairs = self._where, self._pairs
        previous = self._text[-1] if self._text else None
        for pos, token in enumerate(tokens, len(self._text)):
            positions = where.get(token)
            if positions is None:
                where[token] = [pos]
            else:
                positions.append(pos)
            if previous is not None:
                after = pairs.get(pair := (previous, token))
                if after is None:
                    pairs[pair] = [pos]
                else:
                    after.append(pos)
            previous = token
        self._text += tokens

    def matches(self, context: Sequence[int]) -> list[tuple[int, int]]:
        """(match length, position) of the longest-matching earlier occurrences of the context's
        last token, longest first (ties: latest first), at most ``rule.max_candidates``.

        Only the latest ``rule.max_scan`` occurrences count. Those that match two tokens or
        more are found through the index of token pairs; the one-token matches, if any are
        needed, are the latest of the rest.
        """
        if not context:
            return []
        rule = self.rule
        tail = as_tokens(context[-rule.max_match :])
        positions = self._where.get(tail[-1])
        if not positions:
            return []
        first = positions[max(len(positions) - rule.max_scan, 0)]  # the earliest one scanned
        found = self._longer_matches(tail, first) if len(tail) > 1 else []
        if self.min_match == 1 and len(found) < rule.max_candidates:
            found += self._one_token_matches(tail, positions, first, rule.max_candidates - len(found))
        if self._predicted:  # of matches as long, the prediction's first (then the latest)
            end = self._predicted
            found.sort(key=lambda match: (match[0], match[1] < end, match[1]), reverse=True)
        return found

    def _longer_matches(self, tail: list[int], first: int) -> list[tuple[int, int]]:
        text, last, most = self._text, len(self._text) - 1, self.rule.max_candidates
        found: list[tuple[int, int]] = []
        whole = 0  # matches of the whole tail, the longest there can be
        for pos in reversed(self._pairs.get((tail[-2], tail[-1]), ())):
            if pos < first:
                break
            if pos == last or text[pos + 1] == _SEPARATOR:
                continue  # nothing follows it
            length = 2
            while length < len(tail) and pos >= length and text[pos - length] == tail[-1 - length]:
                length += 1
            if length >= self.min_match:
                found.append((length, pos))
                whole += length == len(tail)
                if whole == most:
                    break  # the earlier ones cannot rank above these
        found.sort(reverse=True)
        del found[most:]
        return found

    def _one_token_matches(
        self, tail: list[int], positions: list[int], first: int, wanted: int
    ) -> list[tuple[int, int]]:
        text, last = self._text, len(self._text) - 1
        before = tail[-2] if len(tail) > 1 else None  # where it precedes, the match is longer
        found: list[tuple[int, int]] = []
        for pos in reversed(positions):
            if pos < first:
                break
            if pos == last or text[pos + 1] == _SEPARATOR or (pos and text[pos - 1] == before):
                continue
            found.append((1, pos))
            if len(found) == wanted:
                break
        return found

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        root = context[-1]
        found = self.matches(context) if budget > 0 else []
        return StepDraft(_Votes(self._tables, self._text, found, self._predicted).draft(root, budget))

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        self._append(as_tokens(tokens))

    def close(self) -> None:
        self._text.clear()
        self._where.clear()
        self._pairs.clear()


class _Tables(NamedTuple):
    weights: list[float]  # by match length
    depths: list[int]  # by match length
    sources: list[str]  # by match length
    predicted: list[str]  # by match length, for a match in the prediction
    min_share: float


# (-weight, first voter, depth, token, parent's index in the draft, estimate, voters):
# heap order = best first; (first voter, depth) is unique, so ties never reach the rest.
_Entry = tuple[float, int, int, int, int, float, list[int]]


class _Votes:
    """The candidates' votes, read out best-first without building the whole vote tree.

    A node of the vote tree is the group of candidates whose continuations share its path; its
    weight is their votes. Weights shrink down every path, so only the children of the nodes
    taken so far can be taken next: a node's children are grouped when it is taken, and the
    tree below the rest is never built. The draft is the one the whole tree would give, to the
    float: every sum adds the same votes in the same order (the candidates', longest first).
    """

    def __init__(
        self, tables: _Tables, text: list[int], found: list[tuple[int, int]], predicted: int
    ) -> None:
        self.text = text
        self.found = found
        self.weights = [tables.weights[length] for length, _ in found]
        self.sources = [
            (tables.predicted if pos < predicted else tables.sources)[length] for length, pos in found
        ]
        # Candidate i drafts text[starts[i] : ends[i]], up to a separator.
        self.starts = [pos + 1 for _, pos in found]
        self.ends = [min(pos + 1 + tables.depths[length], len(text)) for length, pos in found]
        total = 0.0
        for weight in self.weights:
            total += weight
        self.floor = tables.min_share * total

    def draft(self, root: int, budget: int) -> DraftTree:
        tokens: list[int] = []
        parents: list[int] = []
        sources: list[str] = []
        estimates: list[float] = []
        heap: list[_Entry] = []
        self._push_children(heap, list(range(len(self.found))), 0, -1)
        while heap and len(tokens) < budget:
            _, first, depth, token, parent, estimate, group = heapq.heappop(heap)
            tokens.append(token)
            parents.append(parent)
            sources.append(self.sources[first])  # its first voter's match is the longest
            estimates.append(estimate)
            if len(tokens) < budget:
                self._push_children(heap, group, depth, len(tokens) - 1)
        return DraftTree.from_draft(root, tokens, parents, sources, estimates)

    def _push_children(self, heap: list[_Entry], group: list[int], depth: int, index: int) -> None:
        """Push the children (with at least the floor's weight) of the node at ``depth`` whose
        voters are ``group`` (ascending) and whose place in the draft is ``index``."""
        text, starts, ends, weights = self.text, self.starts, self.ends, self.weights
        if len(group) == 1:  # the common case, down a long match's chain: no grouping
            i = group[0]
            at = starts[i] + depth
            weight = weights[i]  # the child's, and the node's reach: its estimate is 1
            if at < ends[i] and (token := text[at]) != _SEPARATOR and weight >= self.floor:
                heapq.heappush(heap, (-weight, i, depth + 1, token, index, weight / weight, group))
            return
        reach = 0.0  # the votes of the group's candidates that continue below the node
        children: dict[int, tuple[list[float], list[int]]] = {}
        for i in group:
            at = starts[i] + depth
            if at < ends[i] and (token := text[at]) != _SEPARATOR:
                reach += weights[i]
                child = children.get(token)
                if child is None:
                    children[token] = ([weights[i]], [i])
                else:
                    child[0][0] += weights[i]
                    child[1].append(i)
        for token, ([weight], voters) in children.items():
            if weight >= self.floor:
                # Ties go to the node the whole tree would have created first: the one whose
                # first voter comes first, then the shallower.
                entry = (-weight, voters[0], depth + 1, token, index, weight / reach, voters)
                heapq.heappush(heap, entry)
