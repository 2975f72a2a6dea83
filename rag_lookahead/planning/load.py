"""How busy the machine was while something was timed, so that a timing can say so.

A forward timed while other processes compete for the cores takes longer than it would alone:
a speed-up measured then, or a cost curve, is partly the other work's. `watch_load` notes the
system's load average and this process's CPU time around a block; `MachineLoad` says whether
other work ran beside it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["MachineLoad", "load_average", "watch_load"]


@dataclass(frozen=True)
class MachineLoad:
    """What the machine did while a block ran.

    Attributes:
        seconds: Wall-clock seconds watched.
        own_cores: Cores this process kept busy on average (its CPU seconds over ``seconds``).
        load: The system's one-minute load average at the end (processes running or waiting
            for a core, this one's threads included); ``None`` where the system has none.
        cores: Cores the system has.
    """

    seconds: float
    own_cores: float
    load: float | None
    cores: int

    @property
    def others(self) -> float | None:
        """Runnable work besides this process, in cores (``None`` when the load is unknown)."""
        return None if self.load is None else max(self.load - self.own_cores, 0.0)

    @property
    def busy(self) -> bool:
        """Whether other work kept at least a core, or a quarter of the cores, busy: enough to
        slow down forwards that use every core."""
        others = self.others
        return others is not None and others >= max(1.0, 0.25 * self.cores)

    def describe(self) -> str:
        """One line for a user: the load seen, and what it means for timings made meanwhile."""
        if self.load is None:
            return "the system load is unknown here; timings assume a quiet machine"
        seen = (
            f"load average {self.load:.1f} on {self.cores} cores, this process using "
            f"{self.own_cores:.1f} of them"
        )
        if self.busy:
            return (
                f"the machine was busy ({seen}): other work shared the cores, so these timings "
                "are partly its; run again on a quiet machine for a fair figure"
            )
        return f"the machine was quiet ({seen})"


def load_average() -> float | None:
    """The one-minute load average, or ``None`` where the system keeps none (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@contextmanager
def watch_load(
    clock: Callable[[], float] = time.perf_counter,
    cpu: Callable[[], float] = time.process_time,
    load: Callable[[], float | None] = load_average,
) -> Iterator[list[MachineLoad]]:
    """Watch the block: the list yielded holds its `MachineLoad` once the block has ended.

    The clocks and the load are arguments so that tests can give their own."""
    seen: list[MachineLoad] = []
    wall, used = clock(), cpu()
    try:
        yield seen
    finally:
        seconds = max(clock() - wall, 1e-9)
        seen.append(MachineLoad(seconds, (cpu() - used) / seconds, load(), os.cpu_count() or 1))
