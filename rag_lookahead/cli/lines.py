"""The library's log records the command line shows: as lines on standard error."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["logged_lines"]


@contextmanager
def logged_lines(logger_name: str, form: str = "%(message)s") -> Iterator[None]:
    """Within this block the records of the logger ``logger_name`` (at INFO and above) are
    lines on standard error, formatted by ``form``; after it the logger is as it was."""
    logger = logging.getLogger(logger_name)
    handler = logging.StreamHandler(sys.stderr)  # the stream at the time: a test's capture too
    handler.setFormatter(logging.Formatter(form))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
