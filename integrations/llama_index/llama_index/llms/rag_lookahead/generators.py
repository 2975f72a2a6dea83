"""Token generators advanced inside a context: a streaming response decodes only when its
reader advances it, long after the call that returned it, and each advance must see what that
call saw (its query's scope, its run)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from contextlib import AbstractContextManager
from typing import Any, TypeVar

__all__ = ["aadvanced_in", "advanced_in"]

T = TypeVar("T")
_DONE: Any = object()


def advanced_in(
    items: Iterator[T],
    context: Callable[[], AbstractContextManager[Any]],
    closed: Callable[[], None] | None = None,
) -> Generator[T, None, None]:
    """``items``, each advanced inside ``context()``; closing (or finishing) this generator
    closes ``items`` now rather than at garbage collection, then calls ``closed``."""
    try:
        while True:
            with context():
                item = next(items, _DONE)
            if item is _DONE:
                return
            yield item  # outside the block: the reader's own context stays untouched
    finally:
        try:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # ends the LLM call now rather than when it is garbage-collected
        finally:
            if closed is not None:
                closed()


async def aadvanced_in(
    items: AsyncIterator[T],
    context: Callable[[], AbstractContextManager[Any]],
    closed: Callable[[], None] | None = None,
) -> AsyncGenerator[T, None]:
    """`advanced_in` for async generators."""
    try:
        while True:
            with context():
                item = await anext(items, _DONE)
            if item is _DONE:
                return
            yield item
    finally:
        try:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            if closed is not None:
                closed()
