"""Constrained answers: grammars (JSON schemas, regular expressions) the engine decodes under."""

from rag_lookahead.structured.grammar import Grammar, GrammarKind

__all__ = ["Grammar", "GrammarKind"]
