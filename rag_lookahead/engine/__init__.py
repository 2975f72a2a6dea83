"""The engine: the only code that calls the model.

`LookaheadEngine` (`lookahead`) takes the public calls and hands each to the `Scheduler`
(`scheduler`), which admits them, plans every step, runs it through the executor
(`executor`, one forward over all rows) and updates each call (`request`) with what it
accepted. `pricing` measures what forwards cost; `model_facts` holds what a call needs to know
of the model and tokenizer; `scope` keeps documents in the trie across calls. The loop runs in
the model's own thread (`rag_lookahead.runtime.threads.ModelThread`).
"""

from __future__ import annotations

from rag_lookahead.engine.lookahead import LookaheadEngine

__all__ = ["LookaheadEngine"]
