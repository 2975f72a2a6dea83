"""A call's grammar at every node of a draft tree, with llguidance.

Constrained decoding picks each token from the model's distribution restricted to the tokens
that keep the text inside the grammar. In a tree every node has its own prefix, so each gets
its own allowed set: the matcher is advanced along the tree, depth first, and rolled back. A
draft token the grammar refuses is dropped before the forward (the model could never pick
it), and the tokens the grammar forces next are drafted first. The output is the one
constrained plain decoding gives, since each node's token is chosen exactly as plain decoding
would choose it after that node's prefix.

A grammar marked `closes_in_budget` also ends within the call's token budget where it can: the
model's token at a node is kept only if the text after it can still be completed in the tokens
left after it; else the node takes the next token of the completion of its own prefix. Both
depend on the node's prefix and its tokens left alone (a node at depth d has d fewer), as
plain decoding's choice does, so the output stays the one constrained plain decoding gives.

Every node is checked, however many tokens are left: a check skipped while many are left
lets the model open what cannot close in time (a completion longer than the distance at which
checks begin), so a budget that holds the empty answer's completion could still be cut. What
keeps that affordable is that a completion is a function of the matcher's state alone, and
after its first token it is the rest of itself: the completion of each node's prefix is kept
(across steps too), so a token that follows it (as the forced keys and separators do)
costs no search, and any other token one search from the state after it. A search stops at
the tokens left and at a cap (the empty answer's completion, sought once at the call's first
step, plus `_CLOSING_SLACK`), so its cost grows with the schema, never with
``max_new_tokens``. The cap does not weaken the promise: the empty
answer's completion fits under it, and a node that keeps the model's token only where the
completion after it fits under both passes that on to the next node (induction on the
depth); past the cap, a rare text (an optional object that requires more keys than that)
is closed early rather than searched for without bound.

llguidance was chosen over xgrammar and outlines-core by `benchmarks/grammar_choice.py`: every
schema shape of the set compiles and enforces, rollback and forced tokens are built in, the
masks cost microseconds against a forward's milliseconds, and it is one MIT wheel with no
dependencies (xgrammar pulls triton; outlines-core missed integer bounds).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.structured.grammar import Grammar

__all__ = ["Closers", "GrammarCompiler", "GrammarState", "check_grammar", "to_lark"]

_BITS = torch.arange(32, dtype=torch.int32)  # bit k of each 32-bit mask word
# JSON is laid out as `json.dumps` writes it: a small model given free whitespace can pad an
# answer with newlines until it runs out of tokens, and a fixed layout lets the grammar force
# the keys and separators (drafted for free) instead of leaving them to the model.
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Where the grammar forces nothing, a completion tries these texts in turn, those the vocabulary
# spells in one token (outside a string, those that close objects and arrays first; inside one,
# those that end it): they end what is open, go on to a required key, or are the shortest
# values (0, "", true, null) a schema allows.
_CLOSERS: tuple[str, ...] = ("}}", "]}", "}]", "}", "]", ",", "0", '""', '"', "true", "null", "false")
_CLOSERS += ("t", "n", "f", ".", "a", " ")  # where the ones above take more than a token
_STRING_ENDS = ('"}', '"]', '"')
_IN_TEXT = "a"  # allowed inside a free string, and nowhere a JSON value begins
# These end a value or a string, and one of them allowed after a token means that a value may
# end there: a completion prefers such a token, so that it does not spell a number or a
# patterned string on and on (`0.5000...` under an exclusive minimum of 0.5) when another
# token would end it.
_VALUE_ENDS = ("}}", "]}", "}]", "}", "]", ",", *_STRING_ENDS)
# Where no closer ends a value, this many of the lowest tokens the grammar allows are tried.
_SCANNED = 64
# A completion is sought up to this many tokens past the empty answer's (see the docstring).
_CLOSING_SLACK = 256


def to_lark(grammar: Grammar) -> str:
    """``grammar`` in llguidance's Lark dialect: one rule per part, JSON through ``%json``."""
    rules: list[str] = []

    def rule(part: Grammar) -> str:
        index = len(rules)
        rules.append("")  # this part's slot; its own parts take the next ones
        rules[index] = f"r{index}: {_expression(part, rule)}"
        return f"r{index}"

    rule(grammar)
    return "\n".join(["start: r0", *rules]) + "\n"


def check_grammar(grammar: Grammar) -> None:
    """Raise the `ValueError` a call under ``grammar`` would start with where llguidance
    refuses the grammar itself (a JSON schema of an unknown type, a bad pattern, a ``$ref``
    to nothing...), without a tokenizer: a request's grammar is refused as it is read."""
    import llguidance

    error = llguidance.LLMatcher.validate_grammar(to_lark(grammar), None)
    if error:
        raise ValueError(f"the grammar cannot be used: {_first_line(error)}")


def _expression(grammar: Grammar, rule: Callable[[Grammar], str]) -> str:
    kind = grammar.kind
    if kind in ("json_schema", "json"):
        schema = json.loads(grammar.value) if kind == "json_schema" else {"type": "object"}
        schema.setdefault("x-guidance", _JSON_LAYOUT)  # a schema's own layout wins
        return f"%json {json.dumps(schema)}"
    if kind == "literal":
        return json.dumps(grammar.value, ensure_ascii=False)
    if kind == "regex":
        return "/" + grammar.value.replace("/", "\\/") + "/"
    joiner = " " if kind == "sequence" else " | "
    return joiner.join(rule(part) for part in grammar.parts)


class GrammarCompiler:
    """Grammars for one tokenizer: the llguidance view of the vocabulary is built once per
    set of end-of-sequence tokens (it takes a moment), each grammar per call (milliseconds)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._views: dict[tuple[int, ...], Any] = {}
        self._lock = threading.Lock()

    def state(self, grammar: Grammar, eos: Sequence[int], context_window: int | None = None) -> GrammarState:
        """A fresh matcher for ``grammar`` that ends on any of ``eos``; a clear error for a
        grammar llguidance refuses, and for one no answer can complete (see `GrammarState.check`)."""
        import llguidance

        # Quiet: its warnings are the errors raised here, which say what went wrong.
        matcher = llguidance.LLMatcher(self._view(tuple(eos)), to_lark(grammar), log_level=0)
        if matcher.is_error():
            raise ValueError(f"the grammar cannot be used: {_first_line(matcher.get_error())}")
        closers = self._closers(tuple(eos)) if grammar.closes_in_budget else None
        state = GrammarState(matcher, self.vocab_size, eos, closers)
        state.check(context_window)
        return state

    def _view(self, eos: tuple[int, ...]) -> Any:
        import llguidance.hf

        if not eos:
            raise ValueError("a grammar needs an end-of-sequence token to end the answer on")
        with self._lock:
            view = self._views.get(eos)
            if view is None:
                view = llguidance.hf.from_tokenizer(
                    self.tokenizer, n_vocab=self.vocab_size, eos_token=list(eos)
                )
                self._views[eos] = view
            return view

    def _closers(self, eos: tuple[int, ...]) -> Closers:
        """The one-token spellings of `_CLOSERS` (and of `_STRING_ENDS`, `_IN_TEXT`)."""
        view = self._view(eos)
        texts = (*_STRING_ENDS, *_CLOSERS, *_VALUE_ENDS, _IN_TEXT)
        single = {c: ids[0] for c in texts if len(ids := view.greedy_tokenize(c)) == 1}
        outside = tuple(dict.fromkeys(single[c] for c in _CLOSERS if c in single))
        inside = tuple(dict.fromkeys(single[c] for c in (*_STRING_ENDS, *_CLOSERS) if c in single))
        ends = tuple(dict.fromkeys(single[c] for c in _VALUE_ENDS if c in single))
        return Closers(inside, outside, single.get(_IN_TEXT), ends, single.get(" "))


@dataclass(frozen=True)
class Closers:
    """The tokens a completion tries where the grammar forces nothing, in order: ``inside`` a
    string (where ``in_text`` is allowed) and ``outside`` one; ``ends``: those that end a value
    or a string (see `_VALUE_ENDS`); ``space``: the space, taken without looking further."""

    inside: tuple[int, ...]
    outside: tuple[int, ...]
    in_text: int | None
    ends: tuple[int, ...] = ()
    space: int | None = None


class GrammarState:
    """Where one call stands in its grammar: after the tokens it has emitted. With ``closers``
    (a grammar that closes in budget), `within_budget` keeps the text completable in time."""

    def __init__(
        self, matcher: Any, vocab_size: int, eos: Sequence[int], closers: Closers | None = None
    ) -> None:
        import llguidance.torch

        self._matcher = matcher
        self._vocab = vocab_size
        self._eos = list(eos)
        self._fill = llguidance.torch.fill_next_token_bitmask
        self._words = (vocab_size + 31) // 32
        self._closers = closers
        # Closing in budget: the longest completion sought (set at the call's first step), the
        # completion of the text so far where known, and the last path `within_budget` chose
        # with the completion after each of its tokens (where known), for `advance` to keep.
        self._cap: int | None = None
        self._known: tuple[int, ...] | None = None
        self._chosen: tuple[list[int], list[tuple[int, ...] | None]] = ([], [])

    def check(self, context_window: int | None) -> None:
        """Refuse, before any work, a grammar that can only give an empty answer or none that
        ends: one that allows nothing but an end-of-sequence token at the start, or one whose
        forced text runs past the context window (a schema that requires itself)."""
        allowed = self.allowed(DraftTree.root_only(0))[0]  # [V]
        if not allowed.any():
            raise ValueError(f"the grammar allows no text: {self._error()}")
        if bool(allowed[self._eos].sum() == allowed.sum()):
            raise ValueError(
                "the grammar accepts only empty text"
                if self._matcher.is_accepting()
                else "the grammar accepts no text (e.g. a schema that only refers to itself)"
            )
        probe = self._matcher.deep_copy()  # an endless forced text leaves its matcher in error
        forced = len(probe.compute_ff_tokens())
        if probe.is_error():
            raise ValueError(
                f"the grammar cannot be used: {_first_line(probe.get_error())} "
                "(a recursive schema that never ends?)"
            )
        if context_window is not None and forced >= context_window:
            raise ValueError(
                f"the grammar forces {forced} tokens before any choice, past the model's "
                f"{context_window}-token context window: no answer can end"
            )

    def forced(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar forces next (the canonical tokens of its forced
        text); a draft, verified like any other."""
        tokens = list(self._matcher.compute_ff_tokens())
        if self._matcher.is_error():
            raise RuntimeError(f"the grammar cannot continue: {self._error()}")
        return tokens[: max(limit, 0)]

    def admitted(self, tree: DraftTree) -> DraftTree:
        """``tree`` without the nodes the grammar refuses (and their subtrees)."""
        keep: list[int] = []
        self._walk(tree, 0, lambda node: keep.append(node))
        return tree.subtree(keep) if len(keep) < len(tree) else tree

    def allowed(self, tree: DraftTree) -> torch.Tensor:
        """``[n, V]`` bool: the tokens the grammar allows after each node's prefix. Every
        node of ``tree`` must be admitted (see `admitted`)."""
        bits = torch.zeros(len(tree), self._words, dtype=torch.int32)  # [n, W]
        visited = self._walk(tree, 0, lambda node: self._fill(self._matcher, bits, node))
        if visited != len(tree):
            raise ValueError("the draft tree holds tokens the grammar refuses")
        # Unpacked here rather than with llguidance.torch.apply_token_bitmask_inplace, which
        # compiles a kernel with torch.compile on first use (seconds, and a C compiler on a CPU).
        allowed = ((bits.unsqueeze(-1) >> _BITS) & 1).bool().reshape(len(tree), -1)  # [n, 32 W]
        allowed = allowed[:, : self._vocab]  # [n, V]
        if not allowed.any(dim=-1).all():
            raise RuntimeError(f"the grammar allows no token here: {self._error()}")
        return allowed

    def advance(self, tokens: Sequence[int]) -> None:
        """Take the call's emitted ``tokens`` (each one the grammar allowed)."""
        for token in tokens:
            if not self._matcher.consume_token(token):
                raise RuntimeError(
                    f"the grammar reached a dead end: it allowed token {token} but cannot continue "
                    f"after it ({self._error()}); the tokenizer may not spell what the grammar needs"
                )
        if tokens:
            self._known = self._known_after(list(tokens))

    def _known_after(self, tokens: list[int]) -> tuple[int, ...] | None:
        """The completion after ``tokens`` if they begin the path `within_budget` chose last."""
        path, after = self._chosen
        self._chosen = ([], [])
        return after[len(tokens) - 1] if tokens == path[: len(tokens)] else None

    def finish(self, tokens: Sequence[int]) -> None:
        """Take a last step's ``tokens``, which end on an end-of-sequence token: the text must
        be complete in the grammar (llguidance allows the end at a dead end too)."""
        self.advance(tokens[:-1])
        if not self._matcher.is_accepting():
            raise RuntimeError(
                "the grammar reached a dead end: nothing it accepts follows the text so far "
                f"({self._error()})"
            )

    def within_budget(self, tree: DraftTree, chosen: Sequence[int], room: int) -> list[int]:
        """``chosen`` (the model's token at each node of ``tree``) kept to what can still end in
        time: along the path the call would accept, a token after which the text could no
        longer be completed in the tokens left becomes the next token of the completion of
        its node's prefix (where one fits). ``room``: the tokens the call may still emit."""
        chosen = list(chosen)
        if self._closers is None:
            return chosen
        if self._cap is None:  # the call's first step: the empty answer's completion
            self._known = self._closing(room)
            self._cap = (len(self._known) if self._known is not None else 0) + _CLOSING_SLACK
        node, depth, known = 0, 0, self._known
        path: list[int] = []
        after: list[tuple[int, ...] | None] = []
        try:
            while True:
                # This node's own token included; `known`: the completion of its prefix.
                chosen[node], known = self._fitting(chosen[node], room - depth, known)
                path.append(chosen[node])
                after.append(known)
                child = tree.child(node, chosen[node])
                if child is None:
                    break
                self._matcher.consume_token(tree.tokens[child])
                node, depth = child, depth + 1
        finally:
            if depth:
                self._matcher.rollback(depth)
        self._chosen = (path, after)
        return chosen

    def closing(self, limit: int) -> list[int] | None:
        """The tokens that complete the text so far, the end-of-sequence token last, if they
        are at most ``limit`` (the matcher stands where it stood on return).

        Step by step: a token the grammar forces; else, of the `Closers` it allows, one that
        completes the text at once, else one after which a value may end; else the lowest
        allowed token (of `_SCANNED`) after which one may; else the first closer allowed, or the
        lowest token allowed. Not always the shortest, but a function of the matcher's state
        alone: after its first token, the completion is the rest of it, so a call that takes
        it keeps its place in the budget.
        """
        closing = self._closing(limit)
        return None if closing is None else list(closing)

    def _closing(self, limit: int) -> tuple[int, ...] | None:
        matcher = self._matcher
        tokens: list[int] = []
        try:
            while not matcher.is_accepting():
                if len(tokens) + 2 > limit:  # one more token, then the end-of-sequence token
                    return None
                token = self._closing_step()
                if token is None or matcher.try_consume_tokens([token]) != 1:
                    return None
                tokens.append(token)
            return None if len(tokens) + 1 > limit else (*tokens, self._eos[0])
        finally:
            if tokens:
                matcher.rollback(len(tokens))

    def _fitting(
        self, token: int, left: int, known: tuple[int, ...] | None
    ) -> tuple[int, tuple[int, ...] | None]:
        """``token`` if the text after it can be completed in ``left - 1`` tokens (and the cap),
        else the next token of ``known`` (the completion of the node's prefix, sought here when
        not known) where that fits in ``left``; with the completion after the token returned
        (where known)."""
        assert self._cap is not None
        if token in self._eos:
            return token, None
        fits = min(left - 1, self._cap)
        # The completion after its own first token is the rest of it: no search.
        after = known[1:] if known and known[0] == token else self._closing_after(token, fits)
        if after is not None and len(after) <= fits:
            return token, after
        if known is None:
            known = self._closing(fits + 1)
        if known is not None and len(known) <= fits + 1:
            return known[0], known[1:]
        return token, after

    def _closing_after(self, token: int, limit: int) -> tuple[int, ...] | None:
        """The completion after ``token``, if it is at most ``limit`` tokens."""
        if self._matcher.try_consume_tokens([token]) != 1:
            return None
        try:
            return self._closing(limit)
        finally:
            self._matcher.rollback(1)

    def _closing_step(self) -> int | None:
        matcher, closers = self._matcher, self._closers
        assert closers is not None
        forced = matcher.compute_ff_tokens()
        if forced:
            return int(forced[0])
        inside = closers.in_text is not None and self._admits(closers.in_text)
        tried = closers.inside if inside else closers.outside
        ranked = [(self._progress(token), token) for token in tried]
        progress, token = max(ranked, key=lambda pair: pair[0], default=(-1, 0))
        if progress > 0:  # the first that completes the text, else the first that ends a value
            return token
        first = next((token for progress, token in ranked if progress == 0), None)
        if first is not None and first == closers.space:
            return first  # the layout's space: it goes on to a key or a value
        lowest = self._lowest_allowed()
        ending = next((t for t in lowest if t not in tried and self._progress(t) > 0), None)
        if ending is not None:
            return ending
        return first if first is not None else next(iter(lowest), None)

    def _progress(self, token: int) -> int:
        """Where ``token`` takes the text: -1 refused, 0 allowed, 1 to the end of a value or
        string (it is one of `Closers.ends`, or one of them is allowed after it), 2 to a
        complete text."""
        matcher, closers = self._matcher, self._closers
        assert closers is not None
        if matcher.try_consume_tokens([token]) != 1:
            return -1
        try:
            if matcher.is_accepting():
                return 2
            ends = token in closers.ends or any(self._admits(end) for end in closers.ends)
            return 1 if ends else 0
        finally:
            matcher.rollback(1)

    def _admits(self, token: int) -> bool:
        if self._matcher.try_consume_tokens([token]) != 1:
            return False
        self._matcher.rollback(1)
        return True

    def _lowest_allowed(self) -> list[int]:
        """The lowest `_SCANNED` tokens the grammar allows next, other than the end of sequence."""
        allowed = self.allowed(DraftTree.root_only(0))[0]  # [V]
        allowed[self._eos] = False
        return allowed.nonzero()[:_SCANNED, 0].tolist()

    def _error(self) -> str:
        return _first_line(self._matcher.get_error()) or "no error given"

    def _walk(self, tree: DraftTree, node: int, visit: Callable[[int], object]) -> int:
        """Visit ``node`` and, depth first, each child the grammar admits after it (the
        matcher stands after ``node``'s prefix on entry and on return); how many were visited."""
        visit(node)
        visited = 1
        for child in tree.children(node):
            if self._matcher.try_consume_tokens([tree.tokens[child]]) == 1:
                visited += self._walk(tree, child, visit)
                self._matcher.rollback(1)
        return visited


def _first_line(error: str) -> str:
    """llguidance's error without the parser state it appends."""
    return error.strip().splitlines()[0] if error.strip() else ""
