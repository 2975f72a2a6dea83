"""What an engine measures before it answers anyone: the one place that decides it, for the
app's startup (`create_app`) and the command line's engines (`make_engine`) alike. Needs none of
the serve extra."""

from __future__ import annotations

from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.interface import Engine

__all__ = ["measure_ahead"]


def measure_ahead(engine: Engine, *, remeasure: bool = False, batches: bool = True) -> None:
    """What ``engine``'s first call would otherwise measure, measured now (see
    `LookaheadEngine.measure_ahead`; the batches' costs only with ``batches``: not for a
    process that answers one call at a time); nothing for other engines."""
    if isinstance(engine, LookaheadEngine):
        engine.measure_ahead(remeasure=remeasure, batches=batches)
