"""The shapes a static step forwards: a few row counts times a few tree widths.

A captured graph replays one shape only, so every step is padded up to the smallest bucket
that holds it: its rows to the next row count, its widest tree to the next width. Padding
costs the attention and the MLP of the padded slots; on a GPU a step's time is nearly flat in
its tokens up to tens of them, which is why a handful of buckets loses little.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Bucket", "Buckets"]


class Bucket(NamedTuple):
    """One forward shape: ``rows`` rows of ``width`` slots each."""

    rows: int
    width: int

    def __str__(self) -> str:
        return f"{self.rows}x{self.width}"


@dataclass(frozen=True)
class Buckets:
    """The row counts and tree widths of a static step's shapes (each ascending, from 1).

    Attributes:
        rows: Row counts a step's rows are padded up to; the last is the most rows a step takes.
        widths: Slots a row's tree is padded up to; width 1 is plain decoding, the last is the
            widest tree (a wider draft is cut to it).
    """

    rows: tuple[int, ...] = (1, 2, 4, 8)
    widths: tuple[int, ...] = (1, 4, 8, 16, 32)

    def __post_init__(self) -> None:
        for name, values in (("rows", self.rows), ("widths", self.widths)):
            if not values or values[0] != 1 or list(values) != sorted(set(values)):
                raise ValueError(f"bucket {name} must ascend from 1 without repeats, got {values!r}")

    @property
    def most_rows(self) -> int:
        return self.rows[-1]

    @property
    def widest(self) -> int:
        return self.widths[-1]

    def all(self) -> list[Bucket]:
        """Every bucket, the largest first (captured in that order, the smaller ones then
        reuse the largest one's memory)."""
        return [Bucket(r, w) for r in reversed(self.rows) for w in reversed(self.widths)]

    def fit(self, rows: int, width: int) -> Bucket:
        """The smallest bucket holding ``rows`` rows of at most ``width`` slots."""
        if not 1 <= rows <= self.most_rows:
            raise ValueError(f"a step of {rows} rows does not fit buckets of at most {self.most_rows}")
        if not 1 <= width <= self.widest:
            raise ValueError(f"a tree of {width} slots does not fit buckets of at most {self.widest}")
        return Bucket(_ceil(self.rows, rows), _ceil(self.widths, width))


def _ceil(ladder: tuple[int, ...], value: int) -> int:
    return next(step for step in ladder if step >= value)
