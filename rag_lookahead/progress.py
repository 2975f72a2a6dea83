"""Progress for the waits of more than a moment: converting a model, measuring its costs,
embedding documents.

The library shows none unless asked (``progress=True`` on the calls that wait); the command
line asks. Even then a bar is drawn only on a terminal: `tqdm` on standard error. Where standard
error is a file or a pipe, the same progress goes out as lines (`logging` records of the
``rag_lookahead.progress`` logger, at INFO: a line when a wait starts, one at most every ten
seconds while it lasts, each step of a short one, and one when it ends), which nothing shows
unless logging is configured to (the command line shows them on standard error).

transformers' own bars ("Loading weights", "Writing model shards", the GGUF reader's
"Converting and de-quantizing GGUF tensors") follow the same rule while this package loads or
converts a model (`transformers_bars`), and are left as they were after.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

__all__ = ["PROGRESS_LOGGER", "progress_bar", "transformers_bars"]

#: The logger the progress lines go to where no bar is drawn.
PROGRESS_LOGGER = "rag_lookahead.progress"
# At most one line per this many seconds while a long wait lasts (tqdm's `mininterval`).
_LINE_EVERY = 10.0
# A bar of at most this many steps says each of them (converting a model: three).
_FEW_STEPS = 10


def progress_bar(
    enabled: bool,
    description: str,
    total: int | None = None,
    unit: str = "it",
    iterable: Iterable[Any] | None = None,
) -> Any:
    """A `tqdm` bar on standard error when ``enabled`` and that is a terminal; when ``enabled``
    and it is not, one that tells its progress as lines to the ``rag_lookahead.progress``
    logger; otherwise one that draws nothing. Use it as a context manager, so that it is
    closed, or over ``iterable``, which it then yields from."""
    options: dict[str, Any] = {"iterable": iterable, "total": total, "desc": description, "unit": unit}
    if not enabled:
        return tqdm(**options, disable=True)
    if not on_terminal() and logging.getLogger(PROGRESS_LOGGER).isEnabledFor(logging.INFO):
        every = 0.0 if total is not None and total <= _FEW_STEPS else _LINE_EVERY
        return _LoggedBar(**options, mininterval=every, bar_format=_LINE_FORMAT)
    # disable=None: tqdm's own check that the file is a terminal.
    return tqdm(**options, file=sys.stderr, leave=False, dynamic_ncols=True, disable=None)


def on_terminal() -> bool:
    """Whether standard error is a terminal (where bars are drawn)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(callable(isatty) and isatty())


# tqdm's own fields without the bar: "measuring forward costs (once): 120/400 [00:10<00:23, 12.0forward/s]".
_LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"


class _LoggedBar(tqdm):
    """A tqdm bar that logs its lines rather than drawing them: `display` is tqdm's place for
    sending progress elsewhere (as its Slack and Telegram bars do). tqdm has no line mode of its
    own; on a file that is not a terminal it rewrites one line with carriage returns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._said: int | None = None  # the count of the last line, so that none is said twice
        # Closing writes a newline to the bar's file: a scratch buffer, not standard error.
        super().__init__(*args, file=_Discard(), leave=True, disable=False, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg == "" or self.n == self._said:  # clearing the line, or nothing new to say
            return False
        self._said = self.n
        logging.getLogger(PROGRESS_LOGGER).info(str(self) if msg is None else msg)
        return True


class _Discard:
    """A file that keeps nothing."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


@contextmanager
def transformers_bars(enabled: bool, *, gguf: bool = False) -> Iterator[None]:
    """transformers' progress bars by the rule of `progress_bar` for the duration (shown if
    ``enabled`` and standard error is a terminal, else hidden), through transformers' own
    switch; as they were after. With ``gguf``, the GGUF reader's "Converting and de-quantizing"
    bar too, which calls tqdm itself, past that switch: for the duration it is given the
    switch's tqdm (importing the reader takes seconds, so only where GGUF files are read)."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()
    _switch(hf_logging, enabled and on_terminal())
    reader: Any = importlib.import_module("transformers.modeling_gguf_pytorch_utils") if gguf else None
    own = getattr(reader, "tqdm", None)
    if own is not None:
        reader.tqdm = hf_logging.tqdm
    try:
        yield
    finally:
        if own is not None:
            reader.tqdm = own
        _switch(hf_logging, before)


def _switch(hf_logging: Any, on: bool) -> None:
    if on:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
