"""Progress for long loops: a rich bar on a terminal, periodic log lines elsewhere (DVC, CI)."""

from __future__ import annotations

import logging
import sys
import time
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)


class Progress:
    """Count items done out of `total`; shows the rate in `unit`/s. Use as a context manager.
    `enabled` False: silent (a caller whose loop is sometimes worth showing, sometimes not)."""

    def __init__(self, total: int, desc: str, unit: str = "texts", every_s: float = 10.0,
                 enabled: bool = True) -> None:
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.enabled = enabled
        self.done, self.start = 0, time.perf_counter()
        self._last_log = self.start
        self._bar: Any = None
        if enabled and sys.stderr.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                                 transient=True)
            self._task = self._bar.add_task(desc, total=total, rate="")

    @property
    def rate(self) -> float:
        return self.done / max(time.perf_counter() - self.start, 1e-9)

    def update(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, advance=n, rate=f"{self.rate:,.0f} {self.unit}/s")
        elif self.enabled and time.perf_counter() - self._last_log >= self.every_s:
            self._last_log = time.perf_counter()
            log.info("%s: %d/%d %s (%.0f %s/s)", self.desc, self.done, self.total, self.unit,
                     self.rate, self.unit)

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
        if exc_type is None and self.enabled:
            seconds = time.perf_counter() - self.start
            log.info("%s: %d %s in %.1f s (%.0f %s/s)", self.desc, self.done, self.unit, seconds,
                     self.rate, self.unit)
