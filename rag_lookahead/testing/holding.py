"""Holding an engine's loop still while a test looks at a call in flight.

The loop runs ahead of its readers in its own thread: a short call can end between its
first read and the test's next line. Inside `holding`, every forward after the prompt's
waits until the test lets the loop go on, so a call read once is still running.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["Hold", "holding"]

_HOLD_S = 60.0  # a test that never lets go fails slowly, never hangs
_SOON_S = 0.05


class Hold:
    """Lets a held loop go on: `release` at once, `release_soon` shortly after (for a step
    that blocks until the loop moves: a close or a dropped stream waits for its call's end)."""

    def __init__(self) -> None:
        self.prefilled = threading.Event()
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()

    def release_soon(self) -> None:
        if not self.prefilled.is_set():  # the test would prove nothing
            raise AssertionError("no forward over the prompt came: nothing was held")
        threading.Timer(_SOON_S, self.released.set).start()


@contextmanager
def holding(engine: Any, prompt_ids: Sequence[int]) -> Iterator[Hold]:
    """Hold ``engine``'s forwards after the one over ``prompt_ids`` (a fresh engine's
    prefill) until the yielded `Hold` is released; the model is restored on leaving."""
    hold, model = Hold(), engine.model
    forward, prompt = model.forward, list(prompt_ids)
    own = "forward" in model.__dict__  # else the class's: restored by deleting the instance's

    def held(input_ids: Any, *args: Any, **kwargs: Any) -> Any:
        if hold.prefilled.is_set():
            hold.released.wait(timeout=_HOLD_S)
        if input_ids[0].tolist() == prompt:
            hold.prefilled.set()
        return forward(input_ids, *args, **kwargs)

    model.forward = held
    try:
        yield hold
    finally:
        hold.released.set()
        if own:
            model.forward = forward
        else:  # (an instance attribute left behind would keep the model off its direct forward)
            del model.forward
