"""Argparse types for the numeric flags: a bad value is refused while parsing, before any model,
embedder or index loads, with the flag's name and what it takes (argparse adds both)."""

from __future__ import annotations

import argparse
import math

__all__ = [
    "client_counts",
    "cosine",
    "non_negative_float",
    "non_negative_int",
    "port",
    "positive_float",
    "positive_int",
]


def positive_int(text: str) -> int:
    """An integer of at least 1 (tokens, chunks, records, threads)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An integer of at least 0 (an overlap)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 0, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port to listen on: 1 to 65535."""
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0 (a rate)."""
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number of at least 0 (seconds to wait)."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of at least 0, got {text!r}")
    return value


def cosine(text: str) -> float:
    """A cosine similarity: a number from -1 to 1."""
    value = _float(text)
    if not -1.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a cosine similarity from -1 to 1, got {text!r}")
    return value


def client_counts(text: str) -> list[int]:
    """Comma-separated positive numbers of clients, e.g. ``1,8``."""
    try:
        counts = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    except argparse.ArgumentTypeError:
        counts = []
    if not counts:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, e.g. 1,8; got {text!r}")
    return counts


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):  # float() reads "nan" and "inf", which no setting means
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value
