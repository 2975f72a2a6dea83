"""Progress bars for the waits of more than a moment: converting a model, measuring its costs,
embedding documents.

The library shows none unless asked (``progress=True`` on the calls that wait); the command
line asks. Even then a bar is drawn only on a terminal: `tqdm` on standard error, which stays
silent when standard error is a file or a pipe.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm

__all__ = ["progress_bar"]


def progress_bar(
    enabled: bool,
    description: str,
    total: int | None = None,
    unit: str = "it",
    iterable: Iterable[Any] | None = None,
) -> Any:
    """A `tqdm` bar on standard error when ``enabled`` and that is a terminal; otherwise a bar
    that counts but draws nothing. Use it as a context manager, so that it is closed, or over
    ``iterable``, which it then yields from."""
    return tqdm(
        iterable,
        total=total,
        desc=description,
        unit=unit,
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
        disable=None if enabled else True,  # None: tqdm's own check that the file is a terminal
    )
