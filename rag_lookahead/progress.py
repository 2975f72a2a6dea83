"""Progress for the waits of more than a moment: converting a model, measuring its costs,
embedding documents.

The library shows none unless asked (``progress=True`` on the calls that wait); the command
line asks. Even then a bar is drawn only on a terminal: `tqdm` on standard error. Where standard
error is a file or a pipe, the same progress goes out as lines (`logging` records of the
``rag_lookahead.progress`` logger, at INFO: a line when a wait starts, one at most every ten
seconds while it lasts, each step of a short one, and one when it ends), which nothing shows
unless logging is configured to (the command line shows them on standard error). A bar that is
shown also pulses: every ten seconds without an update it says again where it is, with the time
spent (a thread of its own), so that one long step is never silent.

transformers' own bars ("Loading weights", "Writing model shards", the GGUF reader's
"Converting and de-quantizing GGUF tensors") follow the same rule while this package loads or
converts a model (`transformers_bars`), and are left as they were after.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

__all__ = ["PROGRESS_LOGGER", "Pulse", "progress_bar", "transformers_bars"]

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
    return _PulsedBar(**options, file=sys.stderr, leave=False, dynamic_ncols=True, disable=None)


def on_terminal() -> bool:
    """Whether standard error is a terminal (where bars are drawn)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(callable(isatty) and isatty())


# tqdm's own fields without the bar, and the step under way where one is named (its postfix):
# "measuring forward costs (once): 12/40 [00:10<00:23, 1.2forward/s]".
_LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


class Pulse:
    """Calls ``beat`` every ``every`` seconds from a daemon thread of its own until `stop`:
    what keeps a shown bar saying where it is while one long step counts nothing. ``wait``
    (``threading.Event.wait``'s signature: true once stopped) is the clock; a test gives its own."""

    def __init__(
        self, beat: Callable[[], None], every: float, wait: Callable[[float], bool] | None = None
    ) -> None:
        self._stopped = threading.Event()
        self._beat = beat
        self._every = every
        self._wait = wait or self._stopped.wait
        self._thread = threading.Thread(target=self._run, name="rag-lookahead-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No beat from now on (one under way finishes)."""
        self._stopped.set()

    def _run(self) -> None:
        while not self._wait(self._every) and not self._stopped.is_set():
            self._beat()


class _PulsedBar(tqdm):
    """A tqdm bar drawn again every `_LINE_EVERY` seconds while it is open (its elapsed time
    moves on a terminal even while no step ends)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pulse = None if self.disable else Pulse(self.pulse, _LINE_EVERY)

    def pulse(self) -> None:
        """Say again where the bar is (with the time spent so far)."""
        self.refresh()

    def close(self) -> None:
        pulse = getattr(self, "_pulse", None)
        if pulse is not None:
            pulse.stop()
        super().close()


class _LoggedBar(_PulsedBar):
    """A tqdm bar that logs its lines rather than drawing them: `display` is tqdm's place for
    sending progress elsewhere (as its Slack and Telegram bars do). tqdm has no line mode of its
    own; on a file that is not a terminal it rewrites one line with carriage returns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._said: int | None = None  # the count of the last line, so that none is said twice
        # Closing writes a newline to the bar's file: a scratch buffer, not standard error.
        super().__init__(*args, file=_Discard(), leave=True, disable=False, **kwargs)

    def pulse(self) -> None:
        with self._lock:
            self._said = None  # said again, though the count has not moved
        self.refresh()

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
